"""The lite pull consumer (``client.consumer.lite``): its buffers' rules (round-robin, back-pressure, never
committing past what poll returned) and option checks without processes; on one NameServer and
a 3-node broker group, two members of a group splitting a topic and polling every message
exactly once across a rebalance, a member restarted without having committed everything (only
those messages come twice, none is lost), assign() with seeks and explicit commits, ``async
for``, tag filtering and the blocking twin."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from client import (
    BadFilterError,
    ClientClosedError,
    ClientNotStartedError,
    LitePullConsumer,
    Message,
    MessageQueue,
    Producer,
    ReceivedMessage,
    SyncLitePullConsumer,
    SyncProducer,
)
from client.consumer.lite_buffer import QueueBuffers
from tests.clusters import namesrv_group
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow  # (the first tests are pure; the rest start processes)

FAST = dict(heartbeat_s=0.3, rebalance_s=1.0, auto_commit_interval_s=0.3, suspend_ms=300)
NS = "127.0.0.1:1"  # nothing listens: for the checks made before any connection


def _received(mq: MessageQueue, offset: int) -> ReceivedMessage:
    return ReceivedMessage(mq, offset, b"%d" % offset, "", (), "", "", (), 0, 0, mq.topic)


def test_buffers_take_round_robin_and_commit_only_what_was_polled() -> None:
    q0, q1 = MessageQueue("t", "g", 0), MessageQueue("t", "g", 1)
    b = QueueBuffers(buffer_max=4)
    b.add(q0)
    b.add(q1)
    assert b.committable(q0) == -1 and b.due() == {}  # the start is not known yet
    b.start(q0, 10)
    b.start(q1, 0)
    b.start(q1, 7)  # (a start comes once: a seek or the first one wins)
    _, epoch = b.position(q0)
    assert b.put(q0, epoch, [_received(q0, o) for o in (10, 11, 13)], 15)  # 12, 14: other tags
    assert b.room(q0) == 1 and b.put(q1, 0, [_received(q1, 0)], 1)
    assert b.committable(q0) == 10 and b.due() == {q0: 10, q1: 0}
    got = b.take(2)
    assert [(m.queue, m.queue_offset) for m in got] == [(q0, 10), (q0, 11)]
    assert b.committable(q0) == 13  # the next one poll has not returned
    got = b.take(2)  # starts at the next queue
    assert [(m.queue.queue_id, m.queue_offset) for m in got] == [(1, 0), (0, 13)]
    assert b.committable(q0) == 15 and b.committable(q1) == 1  # filtered ones count as consumed
    b.committed(q0, 15)
    assert b.due() == {q1: 1}
    assert b.put(q0, epoch, [_received(q0, o) for o in range(15, 19)], 19) and b.room(q0) == 0
    b.reset(q0, 3)  # a seek: the buffer goes, a pull begun before cannot land
    assert b.buffered(q0) == 0 and b.committable(q0) == 3
    assert not b.put(q0, epoch, [_received(q0, 19)], 20) and b.position(q0) == (3, epoch + 1)
    assert b.remove(q1) == 1 and q1 not in b and b.take(5) == []
    assert not b.put(q1, 0, [_received(q1, 1)], 2)  # given away meanwhile


@pytest.mark.parametrize("options", [
    {"pull_batch_max": 0}, {"pull_batch_max": 1025}, {"pull_batch_max": 3.0},
    {"pull_batch_max": True}, {"poll_batch_max": 0}, {"buffer_max": 0},
    {"auto_commit": 1}, {"auto_commit_interval_s": 0}, {"heartbeat_s": -1},
    {"rebalance_s": float("nan")}, {"timeout_s": float("inf")}, {"suspend_ms": 15_001},
    {"strategy": "random"}, {"start_from": "middle"}, {"start_from": "timestamp"},
    {"start_timestamp_ms": 5}, {"start_from": "timestamp", "start_timestamp_ms": -1},
    {"client_id": ""},
])
def test_every_option_is_checked(options: dict) -> None:
    with pytest.raises(ValueError):
        LitePullConsumer(NS, "g", **options)


def test_subscribe_and_assign_are_exclusive_and_come_first() -> None:
    mq = MessageQueue("t", "g", 0)
    with pytest.raises(ValueError, match="group"):
        LitePullConsumer(NS, "")
    c = LitePullConsumer(NS, "g")
    with pytest.raises(ValueError, match="before start"):
        asyncio.run(c.start())
    c.subscribe("t", "A || B")
    with pytest.raises(ValueError, match="exclusive"):
        c.assign([mq])
    with pytest.raises(ValueError, match="not both"):
        c.subscribe("u", "A", sql="a > 1")
    with pytest.raises(ValueError):
        c.subscribe("")
    with pytest.raises(BadFilterError):
        c.subscribe("u", sql="a >")  # checked at once, as the push consumer's
    c.subscribe("u", sql="a > 1")  # kept for the pulls
    d = LitePullConsumer(NS, "g")
    d.assign([mq])
    with pytest.raises(ValueError, match="exclusive"):
        d.subscribe("t")
    with pytest.raises(ValueError, match="MessageQueue"):
        d.assign(["t"])  # type: ignore[list-item]
    with pytest.raises(ClientNotStartedError):
        asyncio.run(d.poll(0.1))


@pytest.fixture(scope="module")
def ns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with namesrv_group(tmp_path_factory.mktemp("lite")) as (addr, _):
        yield addr


class Drain:
    """Polls a consumer in the background into ``got`` until stopped (or it is closed)."""

    def __init__(self, consumer: LitePullConsumer, got: list[ReceivedMessage]) -> None:
        self.consumer, self.got = consumer, got
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        for _ in range(10_000):  # bounded: a few hundred polls at most in these tests
            try:
                self.got.extend(await self.consumer.poll(0.3))
            except ClientClosedError:
                return

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def _send(producer: Producer, topic: str, bodies: list[bytes]) -> None:
    for i in range(0, len(bodies), 50):
        await asyncio.gather(*(producer.send(Message(topic, b)) for b in bodies[i:i + 50]))


def _split(a: LitePullConsumer, b: LitePullConsumer, queues: int = 4) -> bool:
    return len(a.assignment) + len(b.assignment) == queues and bool(a.assignment) \
        and bool(b.assignment) and not set(a.assignment) & set(b.assignment)


def test_two_members_split_the_queues_and_poll_every_message_once(ns: str) -> None:
    async def run() -> None:
        async with Producer(ns) as producer:
            await producer.send(Message("lite-jobs", b"warm-up"))  # creates it (4 queues)
            first = [b"early-%d" % i for i in range(100)]
            later = [b"late-%d" % i for i in range(100)]
            await _send(producer, "lite-jobs", first)
            a = LitePullConsumer(ns, "lite-workers", start_from="first", **FAST)
            b = LitePullConsumer(ns, "lite-workers", start_from="first", **FAST)
            a.subscribe("lite-jobs")
            b.subscribe("lite-jobs")
            got_a: list[ReceivedMessage] = []
            got_b: list[ReceivedMessage] = []
            await a.start()
            drains = [Drain(a, got_a)]
            assert len(a.assignment) == 4  # alone: every queue
            await wait_until(lambda: len({m.queue for m in got_a}) == 4, 10,
                             "a's first polls, from every queue")
            await b.start()  # a gives two queues away, with what it polled committed
            drains.append(Drain(b, got_b))
            await wait_until(lambda: _split(a, b), 10, "both members to share the queues")
            await _send(producer, "lite-jobs", later)
            await wait_until(lambda: len(got_a) + len(got_b) >= 201, 20, "every message")
            for d in drains:
                await d.stop()
            await a.close()
            await b.close()
            bodies = Counter(m.body for m in got_a + got_b)
            assert sorted(bodies) == sorted([b"warm-up", *first, *later]), "none lost"
            assert max(bodies.values()) == 1, "none twice"
            assert got_b and {m.queue for m in got_b} <= set(b.assignment)

    asyncio.run(run())


def test_a_restarted_member_resumes_from_the_committed_offsets(ns: str) -> None:
    """A member that committed only part of what it polled leaves: the other takes its queues
    from the committed offsets (what it polled after its commit comes again, nothing is lost);
    restarted, it gets its share back from where the other committed."""
    async def run() -> None:
        async with Producer(ns) as producer:
            await producer.send(Message("lite-restart", b"warm-up"))
            options = dict(FAST, start_from="first")
            a = LitePullConsumer(ns, "lite-restarters", auto_commit=False, **options)
            b = LitePullConsumer(ns, "lite-restarters", **options)
            for c in (a, b):
                c.subscribe("lite-restart")
                await c.start()
            await wait_until(lambda: _split(a, b), 10, "both members to share the queues")
            bodies = [b"job-%d" % i for i in range(200)]
            await _send(producer, "lite-restart", bodies)
            got_a: list[ReceivedMessage] = []
            got_b: list[ReceivedMessage] = []
            drain_b = Drain(b, got_b)
            for _ in range(100):
                got_a += await a.poll(1.0)
                if len(got_a) >= 20:
                    break
            await a.commit()
            for q in a.assignment:
                polled = [m.queue_offset for m in got_a if m.queue == q]
                assert polled == list(range(len(polled)))  # in order, from the first
                if polled:
                    assert await a.committed(q) == len(polled)
            uncommitted: list[ReceivedMessage] = []
            for _ in range(100):
                uncommitted += await a.poll(1.0, max_messages=3)
                if len(uncommitted) >= 10:
                    break
            await a.close()  # no auto commit: those ten were polled, never committed
            await wait_until(lambda: len(b.assignment) == 4, 10, "b to take every queue")
            a2 = LitePullConsumer(ns, "lite-restarters", **options)
            a2.subscribe("lite-restart")
            await a2.start()
            drain_a2 = Drain(a2, got_a)
            await wait_until(lambda: _split(a2, b), 10, "the restarted member's share")
            everything = {b"warm-up", *bodies}
            await wait_until(lambda: {m.body for m in got_a + got_b + uncommitted} >= everything,
                             20, "every message")
            for d in (drain_a2, drain_b):
                await d.stop()
            await a2.close()
            await b.close()
            seen = Counter(m.body for m in got_a + got_b + uncommitted)
            assert set(seen) == everything
            assert {body for body, n in seen.items() if n > 1} == {m.body for m in uncommitted}
            assert max(seen.values()) == 2

    asyncio.run(run())


def test_assign_polls_in_order_seeks_and_commits_only_what_was_polled(ns: str) -> None:
    async def run() -> None:
        async with Producer(ns) as producer:
            await producer.send(Message("lite-manual", b"warm-up"))
            mq, other = sorted(await producer.queues("lite-manual"))[:2]
            start = (await producer.send_to(Message("lite-manual", b"m0"), mq)).queue_offset
            for i in range(1, 30):
                await producer.send_to(Message("lite-manual", b"m%d" % i), mq)
            end = start + 30
            c = LitePullConsumer(ns, "lite-manual-group", auto_commit=False, start_from="first",
                                 buffer_max=8, pull_batch_max=3, **FAST)
            c.assign([mq])
            async with await c.start():
                assert c.assignment == [mq] and c.members == []  # no group membership
                got: list[ReceivedMessage] = []
                for _ in range(100):
                    assert c._buffers.buffered() <= 8  # the bound: pullers wait for polls
                    got += await c.poll(1.0, max_messages=4)
                    if len(got) >= end:
                        break
                assert [m.queue_offset for m in got] == list(range(end))
                assert await c.committed(mq) == -1  # no auto commit
                await c.seek(mq, start + 25)
                (m25, *_) = await c.poll(2.0, max_messages=1)
                assert m25.body == b"m25"
                await c.commit()  # what poll returned: up to m25, not the buffered ones
                assert await c.committed(mq) == start + 26
                await c.commit({mq: start + 5})
                assert await c.committed(mq) == start + 5
                await c.seek_to_begin(mq)
                again = await c.poll(2.0)
                assert again[0].queue_offset == 0 and len(again) <= 8  # (the buffer's bound)
                await c.seek_to_end(mq)
                assert await c.poll(0.5) == []
                late = await producer.send_to(Message("lite-manual", b"late"), mq)
                assert [m.body for m in await c.poll(5.0)] == [b"late"]
                with pytest.raises(ValueError, match="offset"):
                    await c.seek(mq, late.queue_offset + 2)
                with pytest.raises(ValueError, match="not assigned"):
                    await c.seek_to_begin(other)
                c.assign([other])  # re-assigned: mq goes, other comes
                await wait_until(lambda: c.assignment == [other], 5, "the new assignment")
            assert await _committed(ns, "lite-manual-group", [mq]) == {mq: start + 5}  # as left
            with pytest.raises(ClientClosedError):
                await c.poll(0.1)

    asyncio.run(run())


async def _committed(ns: str, group: str, queues: list[MessageQueue]) -> dict[MessageQueue, int]:
    """The group's committed offsets, as a consumer assigned nothing reads them."""
    probe = LitePullConsumer(ns, group)
    probe.assign([])
    async with await probe.start():
        return {mq: await probe.committed(mq) for mq in queues}


def test_async_for_yields_one_at_a_time_and_ends_at_close(ns: str) -> None:
    async def run() -> None:
        async with Producer(ns) as producer:
            await producer.send(Message("lite-iter", b"warm-up", tags="A"))
            for tag in "ABCABCCC":
                await producer.send(Message("lite-iter", tag.encode(), tags=tag))
            queues = await producer.queues("lite-iter")
            ends = {mq: await probe_end(producer, mq) for mq in queues}
            c = LitePullConsumer(ns, "lite-iter-group", start_from="first", **FAST)
            c.subscribe("lite-iter", "A || B")
            await c.start()
            got: list[ReceivedMessage] = []

            async def read() -> None:
                async for m in c:
                    got.append(m)

            reader = asyncio.create_task(read())
            await wait_until(lambda: len(got) >= 5 and all(
                c._buffers.committable(mq) == ends[mq] for mq in queues), 10, "every message")
            await c.close()  # commits what was yielded, the C ones as consumed
            await asyncio.wait_for(reader, 5)  # the loop ended
            assert sorted(m.body for m in got) == [b"A", b"A", b"B", b"B", b"warm-up"]
            assert await _committed(ns, "lite-iter-group", queues) == ends
            s = LitePullConsumer(ns, "lite-sql-group", start_from="first", **FAST)
            s.subscribe("lite-iter", sql="TAGS IN ('B', 'C') AND TAGS <> 'B'")
            async with await s.start():
                only_c: list[ReceivedMessage] = []
                for _ in range(50):
                    only_c += await s.poll(1.0)
                    if len(only_c) >= 4:
                        break
            assert [m.body for m in only_c] == [b"C"] * 4

    asyncio.run(run())


async def probe_end(producer: Producer, mq: MessageQueue) -> int:
    """The queue's next offset, from a message sent to it as a probe (tag P, never polled)."""
    return (await producer.send_to(Message(mq.topic, b"probe", tags="P"), mq)).queue_offset + 1


def test_the_blocking_twin(ns: str) -> None:
    with SyncProducer(ns) as producer:
        producer.send(Message("lite-sync", b"warm-up"))
        for i in range(20):
            producer.send(Message("lite-sync", b"s%d" % i))
    with pytest.raises(ValueError, match="before start"):
        SyncLitePullConsumer(ns, "lite-sync-group", **FAST).start()  # nothing to consume
    c = SyncLitePullConsumer(ns, "lite-sync-group", start_from="first", auto_commit=False,
                             **FAST)
    c.subscribe("lite-sync")
    got: list[ReceivedMessage] = []
    later: list[ReceivedMessage] = []

    def read(into: list[ReceivedMessage], most: int) -> None:
        for m in c:
            into.append(m)
            if len(into) == most:
                break

    with c:
        first_reader = threading.Thread(target=read, args=(got, 21))
        first_reader.start()
        first_reader.join(10)
        assert len(got) == 21 and len(c.assignment) == 4
        first = got[0]
        c.seek_to_begin(first.queue)
        again = c.poll(5.0, max_messages=1)
        assert again and again[0].queue_offset == 0
        c.commit({first.queue: 1})
        assert c.committed(first.queue) == 1
        reader = threading.Thread(target=read, args=(later, 1000))
        reader.start()
    reader.join(5)  # c closed at the end of the with block
    assert not reader.is_alive(), "the iteration ended at close"
    assert sorted(m.body for m in got) == sorted([b"warm-up", *(b"s%d" % i for i in range(20))])
    assert {m.queue for m in later} <= {first.queue}  # only the queue sought back came again
    with pytest.raises(ClientClosedError):
        c.poll(0.1)
