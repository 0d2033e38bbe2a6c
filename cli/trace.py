"""``dledger message trace ID``: a message's life from the trace topic (``client.trace.records``): its
send, then each consumer group's consume attempts in time order, as the tracing clients
(``trace=True``) recorded them. ID is the message's offset msg id or its unique key (the
``msg_id`` of a send). The records are found through the key index (``client.MessageQuery``):
each trace message is keyed by the traced message's unique key and offset msg id."""

from __future__ import annotations

import dataclasses
import json

import click

from cli.common import namesrv_option, run
from client import MessageQuery
from client.cluster.query import group_of
from client.errors import MessageNotFoundError
from client.trace.records import TRACE_TOPIC, TraceRecord, TraceRecordError, decode_record, format_life


async def find_records(q: MessageQuery, message_id: str,
                       max_records: int) -> tuple[list[TraceRecord], int]:
    """(the records of ``message_id``'s life, how many trace messages under its keys were not
    trace records). Asked by the id; then by the unique key the records (or, failing them,
    the stored message) name, which also finds the consume records of its retries (read from
    copies with offset msg ids of their own)."""
    asked: set[str] = set()
    seen: set[str] = set()  # trace messages, by their own offset msg id
    records: list[TraceRecord] = []
    garbage = 0
    wanted = {message_id}
    for _ in range(2):  # the id, then the unique key it leads to
        for key in sorted(wanted - asked):
            asked.add(key)
            for found in await q.by_key(TRACE_TOPIC, key, 0, None, max_records):
                if found.offset_msg_id in seen:
                    continue
                seen.add(found.offset_msg_id)
                try:
                    r = decode_record(found.body)
                except TraceRecordError:
                    garbage += 1
                    continue
                if key in (r.unique_key, r.offset_msg_id):
                    records.append(r)
        wanted = {r.unique_key for r in records if r.unique_key}
        if not wanted and _is_offset_msg_id(message_id):
            try:  # nothing traced under the id itself: the stored message names its unique key
                wanted = {(await q.view(message_id)).unique_key} - {""}
            except MessageNotFoundError:
                wanted = set()
        if not wanted - asked:
            break
    return records, garbage


def _is_offset_msg_id(text: str) -> bool:
    try:
        group_of(text)
    except ValueError:
        return False
    return True


@click.command("trace")
@namesrv_option
@click.option("--max", "max_records", type=click.IntRange(1, 1024), default=1024,
              show_default=True, help="Trace messages read per key, at most.")
@click.option("--timeout-s", type=click.FloatRange(min=0.1, max=600), default=5.0,
              show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the records as JSON.")
@click.argument("message_id", metavar="ID")
def message_trace(namesrv: tuple[str, ...], max_records: int, timeout_s: float, as_json: bool,
                  message_id: str) -> None:
    """The life of message ID (its offset msg id, or its unique key: the msg_id a send
    prints): its send, then each consumer group's consume attempts in time order (status,
    cost, client, reconsume times). Only what tracing clients recorded (Producer and consumers
    with trace=True; off by default)."""
    async def main() -> tuple[list[TraceRecord], int]:
        async with MessageQuery(list(namesrv), timeout_s) as q:
            return await find_records(q, message_id, max_records)
    records, garbage = run(main())
    if not records:
        raise click.ClickException(
            f"no trace records of {message_id} in {TRACE_TOPIC} (tracing is off by default: "
            f"Producer(..., trace=True) and the consumers' trace=True turn it on)")
    records.sort(key=lambda r: (r.time_ms, r.kind != "send"))
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(r) for r in records], indent=2))
    else:
        click.echo(format_life(records))
    if garbage:
        click.echo(f"({garbage} message(s) under its keys in {TRACE_TOPIC} were not trace "
                   f"records)", err=True)
