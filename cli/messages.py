"""``dledger send`` and ``dledger consume``: messages in and out on the command line.

``consume`` reads every queue of a topic until it is caught up (up to the end each queue had
when its reading began: pulls stop at 4 MiB or a message count, so one pull is not a queue),
or until ``--max`` messages in total; ``--follow`` then long-polls every queue at once and
prints what is committed until Ctrl-C. Every wait is bounded: one pull waits at most the
consumer's timeout plus its suspend time."""

from __future__ import annotations

import asyncio
import contextlib

import click

from broker.features.delay.model import TIMER_DELIVER_MS
from cli.common import iso_ms, ms_iso, namesrv_option, run, until_interrupted
from client import (
    ClientError,
    Message,
    MessageQuery,
    MessageQueue,
    Producer,
    PullConsumer,
    ReceivedMessage,
    RetriableError,
)
from client.errors import BadFilterError, compile_filter
from protocol import broker_kinds as bp

PULL_BATCH = 256  # messages per pull (the broker caps a pull at 1,024 messages and 4 MiB)
FOLLOW_SUSPEND_MS = 5_000  # one long poll of --follow (the broker holds it at most 15 s)
RETRY_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)  # --follow, after a retriable error (a failover)


@click.command()
@namesrv_option
@click.option("--tags", default="", help="The messages' tag.")
@click.option("--key", "keys", multiple=True, help="A message key (repeatable).")
@click.option("--prop", "props", multiple=True, metavar="NAME=VALUE",
              help="A user property (repeatable).")
@click.option("--timeout-s", type=click.FloatRange(min=0.1, max=3600), default=10.0,
              show_default=True,
              help="How long each send may take, retries and a leader election included.")
@click.option("--delay-level", type=click.IntRange(min=1), default=None,
              help="Deliver after this delay level (1..18: 1s 5s 10s 30s 1m ... 2h by default).")
@click.option("--deliver-at", default=None, metavar="ISO8601",
              help="Deliver at this time (e.g. 2026-12-03T18:00:00+00:00; no zone: local time).")
@click.option("--delay-ms", type=click.IntRange(min=0), default=None,
              help="Deliver this many milliseconds after the broker stores it.")
@click.argument("topic_name")
@click.argument("bodies", nargs=-1, required=True)
def send(namesrv: tuple[str, ...], tags: str, keys: tuple[str, ...], props: tuple[str, ...],
         timeout_s: float, delay_level: int | None, deliver_at: str | None,
         delay_ms: int | None, topic_name: str, bodies: tuple[str, ...]) -> None:
    """Send each BODY as one message to TOPIC_NAME; prints where it was stored (after commit).
    A delayed message has its queue offset only once delivered: it prints when it is due
    instead (the broker's due time, and the delay from its store)."""
    properties = tuple(_prop(p) for p in props)
    if sum(x is not None for x in (delay_level, deliver_at, delay_ms)) > 1:
        raise click.UsageError("give one of --delay-level, --deliver-at, --delay-ms")
    deliver_at_ms = iso_ms(deliver_at, "--deliver-at") if deliver_at is not None else None
    asked = (f"delay level {delay_level}" if delay_level else
             f"deliver at {deliver_at}" if deliver_at is not None else
             f"delay {delay_ms} ms" if delay_ms is not None else "")

    async def main() -> None:
        async with Producer(list(namesrv), send_timeout_s=timeout_s) as producer, \
                contextlib.AsyncExitStack() as stack:
            query: MessageQuery | None = None
            for body in bodies:
                r = await producer.send(Message(topic_name, body.encode(), tags=tags, keys=keys,
                                                properties=properties,
                                                delay_level=delay_level or 0, delay_ms=delay_ms,
                                                deliver_at_ms=deliver_at_ms))
                where = f"offset {r.queue_offset}"
                if asked and r.queue_offset < 0:
                    if query is None:
                        query = await stack.enter_async_context(MessageQuery(list(namesrv)))
                    where = await due_text(query, r.offset_msg_id, asked)
                click.echo(f"{r.status} {r.queue.group}/{r.queue.queue_id} {where} "
                           f"msg_id {r.msg_id} offset_msg_id {r.offset_msg_id}")
    run(main())


async def due_text(query: MessageQuery, offset_msg_id: str, asked: str) -> str:
    """When a delayed message is due, as its broker set it (``TIMER_DELIVER_MS`` of the stored
    copy) and how long after its store; what was asked when that cannot be read (an account
    that may not view messages)."""
    try:
        stored = await query.view(offset_msg_id)
        due_ms = int(dict(stored.properties)[TIMER_DELIVER_MS])
    except (ClientError, KeyError, ValueError) as err:
        return f"delayed ({asked}; its due time could not be read: {type(err).__name__})"
    return (f"due {ms_iso(due_ms)} "
            f"(delay {(due_ms - stored.store_ts_ms) / 1000:g} s)")


def _prop(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise click.BadParameter(f"expected NAME=VALUE, got {text!r}", param_hint="'--prop'")
    return name, value


@click.command()
@namesrv_option
@click.option("--group", "consumer_group", default=None,
              help="Start from this consumer group's committed offsets (where it has none: "
                   "--from-offset or --from-timestamp-ms) and commit what is read.")
@click.option("--from-offset", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--from-timestamp-ms", type=click.IntRange(min=0), default=None,
              help="Start each queue at its first message stored at or after this time "
                   "(milliseconds since the epoch).")
@click.option("--max", "max_messages", type=click.IntRange(min=1), default=None,
              help="Stop after this many messages in total, over every queue (default: no limit).")
@click.option("--count", "count_only", is_flag=True, help="Print only how many messages were read.")
@click.option("--follow", is_flag=True,
              help="Once caught up, wait for new messages and print each as it is committed, "
                   "until Ctrl-C (or --max).")
@click.option("--tags", "tag_expression", default="*", show_default=True,
              help="Only messages with one of these tags ('TagA || TagB').")
@click.option("--sql", default=None,
              help="Only messages whose properties match this SQL92 expression (evaluated at "
                   "the broker), e.g. \"age BETWEEN 0 AND 6 AND TAGS = 'TagA'\".")
@click.argument("topic_name")
def consume(namesrv: tuple[str, ...], consumer_group: str | None, from_offset: int,
            from_timestamp_ms: int | None, max_messages: int | None, count_only: bool,
            follow: bool, tag_expression: str, sql: str | None, topic_name: str) -> None:
    """Read TOPIC_NAME's messages from every queue: each line is group/queue@offset, tags, keys,
    properties, msg_id (the unique key), offset_msg_id and the body."""
    tags = [t.strip() for t in tag_expression.split("||") if t.strip()] or ["*"]
    if sql is not None:
        if tags != ["*"]:
            raise click.UsageError("--tags and --sql do not go together")
        try:
            compile_filter(sql)
        except BadFilterError as err:
            raise click.BadParameter(str(err), param_hint="--sql") from None

    async def main() -> int:
        async with PullConsumer(list(namesrv), consumer_group or "dledger-cli") as consumer:
            reader = _Reader(consumer, consumer_group, max_messages, count_only, tags, sql)
            queues = await consumer.fetch_queues(topic_name)
            offsets = {mq: await reader.start_offset(mq, from_offset, from_timestamp_ms)
                       for mq in queues}
            if follow:
                await until_interrupted(reader.follow(offsets))
            else:
                for mq in queues:
                    await reader.catch_up(mq, offsets[mq])
            return reader.total
    total = run(main())
    if count_only:
        click.echo(total)


class _Reader:
    """Pulls, prints and (for a group) commits; counts against ``--max``."""

    def __init__(self, consumer: PullConsumer, group: str | None, limit: int | None,
                 count_only: bool, tags: list[str], sql: str | None) -> None:
        self.consumer = consumer
        self.tags, self.sql = tags, sql
        self.group = group
        self.limit = limit
        self.count_only = count_only
        self.total = 0
        self.done = asyncio.Event()  # --max reached

    async def start_offset(self, mq: MessageQueue, from_offset: int,
                           from_timestamp_ms: int | None) -> int:
        if self.group:
            committed = await self.consumer.committed(mq)
            if committed >= 0:
                return committed
        if from_timestamp_ms is not None:
            return await self.consumer.offset_for_timestamp(mq, from_timestamp_ms)
        return from_offset

    async def catch_up(self, mq: MessageQueue, offset: int) -> int:
        """Read ``mq`` from ``offset`` up to the end it had at the first pull; the next offset."""
        end: int | None = None
        while not self.done.is_set() and (end is None or offset < end):
            nxt, hi = await self._pull(mq, offset, 0)
            end = hi if end is None else end
            if nxt == offset:  # nothing more (caught up, or a queue that shrank)
                break
            offset = nxt
        return offset

    async def follow(self, offsets: dict[MessageQueue, int]) -> None:
        """Catch up on every queue, then long-poll them all until ``--max`` (or cancelled)."""
        for mq in offsets:
            offsets[mq] = await self.catch_up(mq, offsets[mq])
        if self.done.is_set():
            return
        tasks = [asyncio.ensure_future(self._poll(mq, offsets[mq])) for mq in offsets]
        try:
            waiter = asyncio.ensure_future(self.done.wait())
            finished, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for t in finished:
                t.result()  # a queue's task ends only on an error: raise it
        finally:
            for t in (waiter, *tasks):
                t.cancel()
            await asyncio.gather(waiter, *tasks, return_exceptions=True)

    async def _poll(self, mq: MessageQueue, offset: int) -> None:
        failures = 0
        while True:  # until cancelled (Ctrl-C, --max, another queue's error)
            try:
                offset, _ = await self._pull(mq, offset, FOLLOW_SUSPEND_MS)
                failures = 0
            except RetriableError as err:  # e.g. a leader change: the group comes back
                delay_s = RETRY_BACKOFF_S[min(failures, len(RETRY_BACKOFF_S) - 1)]
                failures += 1
                click.echo(f"{mq.group}/{mq.queue_id}: {type(err).__name__}: {err}; retrying in "
                           f"{delay_s} s", err=True)
                await asyncio.sleep(delay_s)

    async def _pull(self, mq: MessageQueue, offset: int, suspend_ms: int) -> tuple[int, int]:
        """One pull from ``offset``: print and commit what it brings; (next offset, max offset)."""
        res = await self.consumer.pull(mq, offset, PULL_BATCH, suspend_ms=suspend_ms,
                                       tags=self.tags, sql=self.sql)
        if res.status == bp.OFFSET_OUT_OF_RANGE:  # below the first retained message or past
            return (res.min_offset if offset < res.min_offset else res.max_offset), res.max_offset
        msgs = res.messages
        nxt = res.next_offset
        if self.limit is not None and len(msgs) >= self.limit - self.total:
            msgs = msgs[:self.limit - self.total]
            nxt = msgs[-1].queue_offset + 1 if msgs else offset
            self.done.set()
        self.total += len(msgs)
        if not self.count_only:
            for m in msgs:
                click.echo(message_line(m))
        if self.group and nxt != offset:
            await self.consumer.commit(mq, nxt)
        return nxt, res.max_offset


def message_line(m: ReceivedMessage) -> str:
    return (f"{m.queue.group}/{m.queue.queue_id}@{m.queue_offset} tags={m.tags!r} "
            f"keys={list(m.keys)!r} props={dict(m.properties)!r} msg_id={m.msg_id} "
            f"offset_msg_id={m.offset_msg_id} {m.body!r}")


