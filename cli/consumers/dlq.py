"""``dledger dlq list|resend GROUP`` and ``dledger consumer retry GROUP``: a consumer group's dead
letters (``%DLQ%<group>``, messages that failed ``max_reconsume_times`` reconsumes) and its
retries (``%RETRY%<group>``), through the client library."""

from __future__ import annotations

import click

from cli.common import namesrv_option, run
from client import MessageQueue, PullConsumer, ReceivedMessage, TopicNotFoundError

PULL_BATCH = 256


async def _queues(c: PullConsumer, topic: str) -> list[MessageQueue]:
    try:
        return await c.fetch_queues(topic, wait=False)
    except TopicNotFoundError:
        return []  # the group never sent a message back: no such topic yet


async def _read(c: PullConsumer, mq: MessageQueue, limit: int) -> list[ReceivedMessage]:
    out: list[ReceivedMessage] = []
    offset = 0
    while len(out) < limit:
        res = await c.pull(mq, offset, min(PULL_BATCH, limit - len(out)))
        if not res.messages:
            return out
        out += res.messages
        offset = res.next_offset
    return out


def _line(m: ReceivedMessage) -> str:
    props = dict(m.properties)
    return (f"{m.queue.group}/{m.queue.queue_id}@{m.queue_offset} msg_id {m.msg_id} "
            f"topic {m.topic} reconsumed {m.reconsume_times} "
            f"origin {props.get('ORIGIN_MESSAGE_ID', '-')} tags {m.tags or '-'} "
            f"body {m.body.decode(errors='replace')!r}")


@click.group()
def dlq() -> None:
    """A consumer group's dead letters (%DLQ%<group>)."""


@dlq.command("list")
@namesrv_option
@click.option("--max", "limit", type=click.IntRange(min=1), default=1000, show_default=True)
@click.argument("group")
def dlq_list(namesrv: tuple[str, ...], limit: int, group: str) -> None:
    """Print GROUP's dead letters: where each is, its msg id, original topic, reconsume count."""
    async def main() -> None:
        async with PullConsumer(list(namesrv), group) as c:
            found = 0
            for mq in await _queues(c, "%DLQ%" + group):
                for m in await _read(c, mq, limit - found):
                    click.echo(_line(m))
                    found += 1
            if not found:
                click.echo(f"no dead letters for group {group}")
    run(main())


@dlq.command("resend")
@namesrv_option
@click.option("--offset", "offsets", type=click.IntRange(min=0), multiple=True,
              help="Resend only the dead letter at this offset (repeatable; with one broker "
                   "group, or give --broker-group).")
@click.option("--broker-group", default=None, help="The broker group of --offset.")
@click.argument("group")
def dlq_resend(namesrv: tuple[str, ...], offsets: tuple[int, ...], broker_group: str | None,
               group: str) -> None:
    """Put GROUP's dead letters (all, or those at --offset) back into %RETRY%GROUP, so the
    group consumes them again with their reconsume count reset. A resend retried within the
    broker's dedup window (10 min) stores nothing twice."""
    async def main() -> None:
        async with PullConsumer(list(namesrv), group) as c:
            queues = await _queues(c, "%DLQ%" + group)
            if broker_group is not None:
                queues = [q for q in queues if q.group == broker_group]
            if offsets and len({q.group for q in queues}) > 1:
                raise click.UsageError("several broker groups hold dead letters of this group: "
                                       "name one with --broker-group")
            sent = 0
            for mq in queues:
                chosen = list(offsets) or [m.queue_offset for m in await _read(c, mq, 10**9)]
                for offset in chosen:
                    topic = await c.resend_dead_letter(mq, offset)
                    click.echo(f"{mq.group}/{mq.queue_id}@{offset} -> {topic}")
                    sent += 1
            click.echo(f"{sent} dead letter(s) resent")
    run(main())


@click.command("retry")
@namesrv_option
@click.argument("group")
def consumer_retry(namesrv: tuple[str, ...], group: str) -> None:
    """GROUP's retries and dead letters per broker group: messages in %RETRY%GROUP, how many
    the group has consumed, and how many are in %DLQ%GROUP."""
    async def main() -> None:
        async with PullConsumer(list(namesrv), group) as c:
            click.echo(f"{'queue':<24} {'max':>8} {'committed':>10} {'lag':>8}")
            for topic in ("%RETRY%" + group, "%DLQ%" + group):
                queues = await _queues(c, topic)
                if not queues:
                    click.echo(f"{topic:<24} (none yet)")
                for mq in queues:
                    hi = (await c.pull(mq, 0, 0)).max_offset
                    done = await c.committed(mq)
                    name = f"{topic} {mq.group}/{mq.queue_id}"
                    lag = hi - max(done, 0) if topic.startswith("%RETRY%") else hi
                    click.echo(f"{name:<24} {hi:>8} {done:>10} {lag:>8}")
    run(main())
