"""``dledger message``: inspect stored messages (RocketMQ's ``mqadmin queryMsgById`` /
``queryMsgByKey`` / ``queryMsgByUniqueKey``), through the client's ``MessageQuery``.

``message show ID`` prints the message an offset msg id names; ``message query --topic T --key
K [--begin ISO --end ISO]`` those with that key stored within the range, ``message query --topic
T [--begin ISO --end ISO]`` (no key) every message of the topic stored within the range (at
most ``--max``), ``message query --unique-key U [--topic T]`` those with that unique key. Each
message prints its body (text if it is printable UTF-8, else hex), properties, born and store
times, group, queue and offset, and the consumer groups whose committed offset is past it.
``message`` is a click group other commands join (``cli.query.message``)."""

from __future__ import annotations

from collections.abc import Sequence

import click

from cli.common import iso_ms, ms_iso, namesrv_option, run
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
@click.option("--topic", default=None, help="The topic (needed with --key, or alone).")
@click.option("--key", default=None, help="A message key.")
@click.option("--unique-key", default=None, help="A unique key (the msg_id a send prints).")
@click.option("--begin", default=None, metavar="ISO8601",
              help="Stored at or after this time (no zone: local time).")
@click.option("--end", default=None, metavar="ISO8601", help="Stored at or before this time.")
@click.option("--max", "max_messages", type=click.IntRange(1, 1024), default=64,
              show_default=True, help="At most this many messages (by key, or by time).")
@click.option("--timeout-s", type=click.FloatRange(min=0.1, max=600), default=5.0,
              show_default=True)
def query(namesrv: tuple[str, ...], topic: str | None, key: str | None,
          unique_key: str | None, begin: str | None, end: str | None, max_messages: int,
          timeout_s: float) -> None:
    """Print the messages with --key in --topic (within --begin..--end), every message of
    --topic stored within --begin..--end when no key is given, or those with --unique-key;
    newest first."""
    if key is not None and unique_key is not None:
        raise click.UsageError("give --key or --unique-key, not both")
    if unique_key is None and topic is None:
        raise click.UsageError("give --topic (with --key, or alone: by time), or --unique-key")
    if unique_key is not None and (begin or end):
        raise click.UsageError("--begin and --end go with --topic")
    begin_ms = iso_ms(begin, "--begin") if begin else 0
    end_ms = iso_ms(end, "--end") if end else None
    for option, ms in (("--begin", begin_ms), ("--end", end_ms)):
        if ms is not None and ms < 0:
            raise click.BadParameter("before 1970", param_hint=f"'{option}'")
    if end_ms is not None and begin_ms > end_ms:
        raise click.BadParameter(f"{end!r} is before --begin {begin!r}", param_hint="'--end'")

    async def main() -> list[FoundMessage]:
        async with MessageQuery(list(namesrv), timeout_s) as q:
            if unique_key is not None:
                return await q.by_unique_key(unique_key, topic)
            assert topic is not None
            if key is not None:
                return await q.by_key(topic, key, begin_ms, end_ms, max_messages)
            return await q.by_time(topic, begin_ms, end_ms, max_messages)
    found = run(main())
    if not found:
        click.echo("no message found")
        return
    click.echo("\n\n".join(describe(m) for m in found))


def describe(m: FoundMessage) -> str:
    lines = [f"offset_msg_id: {m.offset_msg_id}",
             f"topic: {m.topic}  group: {m.group}  queue: {m.queue_id}  offset: {m.queue_offset}",
             f"stored: {ms_iso(m.store_ts_ms)}  born: {ms_iso(m.born_ts_ms) if m.born_ts_ms else '-'}",
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
