"""``dledger message``: inspect stored messages (RocketMQ's ``mqadmin queryMsgById`` /
``queryMsgByKey`` / ``queryMsgByUniqueKey``), through the client's ``MessageQuery``.

``message show ID`` prints the message an offset msg id names; ``message query --topic T --key
K [--begin ISO --end ISO]`` those with that key stored within the range, ``message query
--unique-key U [--topic T]`` those with that unique key. Each message prints its body (text if
it is printable UTF-8, else hex), properties, born and store times, group, queue and offset,
and the consumer groups whose committed offset is past it. ``message`` is a click group other
commands join (``cli.query.message``)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import click

from cli.common import iso_ms, namesrv_option, run
from client import FoundMessage, MessageQuery

BODY_SHOWN_BYTES = 4096  # of a longer body, the first this many bytes (and its size)


@click.group()
def message() -> None:
    """Inspect stored messages: by offset msg id, by key, by unique key."""


@message.command()
@namesrv_option
@click.option("--timeout-s", type=click.FloatRange(min=0.1, max=600), default=5.0,
              show_default=True)
@click.argument("offset_msg_id")
def show(namesrv: tuple[str, ...], timeout_s: float, offset_msg_id: str) -> None:
    """Print the message OFFSET_MSG_ID names (the offset_msg_id of a send or a consume)."""
    async def main() -> FoundMessage:
        async with MessageQuery(list(namesrv), timeout_s) as q:
            return await q.view(offset_msg_id)
    try:
        found = run(main())
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="'OFFSET_MSG_ID'") from err
    click.echo(describe(found))


@message.command()
@namesrv_option
@click.option("--topic", default=None, help="The topic (needed with --key).")
@click.option("--key", default=None, help="A message key.")
@click.option("--unique-key", default=None, help="A unique key (the msg_id a send prints).")
@click.option("--begin", default=None, metavar="ISO8601",
              help="Stored at or after this time (no zone: local time).")
@click.option("--end", default=None, metavar="ISO8601", help="Stored at or before this time.")
@click.option("--max", "max_messages", type=click.IntRange(1, 1024), default=64,
              show_default=True, help="At most this many messages (by key).")
@click.option("--timeout-s", type=click.FloatRange(min=0.1, max=600), default=5.0,
              show_default=True)
def query(namesrv: tuple[str, ...], topic: str | None, key: str | None,
          unique_key: str | None, begin: str | None, end: str | None, max_messages: int,
          timeout_s: float) -> None:
    """Print the messages with --key in --topic (within --begin..--end), or with --unique-key,
    newest first."""
    if (key is None) == (unique_key is None):
        raise click.UsageError("give one of --key (with --topic) or --unique-key")
    if key is not None and topic is None:
        raise click.UsageError("--key needs --topic")
    if unique_key is not None and (begin or end):
        raise click.UsageError("--begin and --end go with --key")
    begin_ms = iso_ms(begin, "--begin") if begin else 0
    end_ms = iso_ms(end, "--end") if end else None

    async def main() -> list[FoundMessage]:
        async with MessageQuery(list(namesrv), timeout_s) as q:
            if key is not None:
                assert topic is not None
                return await q.by_key(topic, key, begin_ms, end_ms, max_messages)
            assert unique_key is not None
            return await q.by_unique_key(unique_key, topic)
    found = run(main())
    if not found:
        click.echo("no message found")
        return
    click.echo("\n\n".join(describe(m) for m in found))


def describe(m: FoundMessage) -> str:
    lines = [f"offset_msg_id: {m.offset_msg_id}",
             f"topic: {m.topic}  group: {m.group}  queue: {m.queue_id}  offset: {m.queue_offset}",
             f"stored: {_time(m.store_ts_ms)}  born: {_time(m.born_ts_ms) if m.born_ts_ms else '-'}",
             f"tags: {m.tags or '-'}  keys: {' '.join(m.keys) or '-'}  "
             f"unique key: {m.unique_key or '-'}",
             f"properties: {_props(m.properties)}",
             f"consumed by: {', '.join(m.consumed_by) or 'no group (none committed past it)'}",
             f"body ({len(m.body)} bytes{', shown in part' if len(m.body) > BODY_SHOWN_BYTES else ''}"
             f"): {body_text(m.body[:BODY_SHOWN_BYTES])}"]
    return "\n".join(lines)


def body_text(body: bytes) -> str:
    """The body as text if it is printable UTF-8, else as hex (prefixed ``hex:``)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "hex:" + body.hex()
    if all(c.isprintable() or c in "\n\t" for c in text):
        return text
    return "hex:" + body.hex()


def _props(props: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{k}={v}" for k, v in props) or "-"


def _time(ms: int) -> str:
    when = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return when.isoformat(timespec="milliseconds")

