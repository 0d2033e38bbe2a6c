"""The push consumer on real processes: a two-member clustering group shares the queues and
consumes every message exactly once, in queue order; a listener's "later" is redelivered and
nothing is lost; broadcasting members each read everything."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from client import ConsumeStatus, Message, Producer, PullConsumer, PushConsumer
from client.types import ReceivedMessage
from dledger.localcluster import LocalCluster
from tests.broker.test_broker_processes import BROKER, _start_namesrv
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow


def _with_cluster(tmp_path: Path, run: Callable[[str], Coroutine[Any, Any, None]]) -> None:
    """A NameServer and a 3-node broker group for ``run(namesrv)``; both stopped after."""
    ns_proc, ns = _start_namesrv(tmp_path)
    try:
        with LocalCluster(str(tmp_path), size=3, tick_ms=50,
                          program=(*BROKER, "--namesrv", ns, "--register-interval-s", "1")):
            asyncio.run(run(ns))
    finally:
        ns_proc.terminate()
        ns_proc.wait(timeout=10)


class Recorder:
    def __init__(self, later_once: set[bytes] | None = None) -> None:
        self.seen: list[ReceivedMessage] = []
        self.later_once = set(later_once or ())

    def __call__(self, batch: list[ReceivedMessage]) -> ConsumeStatus:
        if any(m.body in self.later_once for m in batch):
            self.later_once -= {m.body for m in batch}
            return ConsumeStatus.LATER
        self.seen.extend(batch)
        return ConsumeStatus.SUCCESS


def test_a_two_member_group_consumes_everything_exactly_once(tmp_path: Path) -> None:
    async def run(ns: str) -> None:
        async with Producer(ns) as producer:
            await producer.send(Message("jobs", b"warm-up"))  # creates the topic (4 queues)
            a, b = Recorder(later_once={b"job-7"}), Recorder()
            ca = PushConsumer(ns, "workers", a, heartbeat_s=0.3, rebalance_s=1, commit_s=0.5,
                              start_from="last", suspend_ms=500)
            cb = PushConsumer(ns, "workers", b, heartbeat_s=0.3, rebalance_s=1, commit_s=0.5,
                              start_from="last", suspend_ms=500)
            ca.subscribe("jobs")
            cb.subscribe("jobs")
            await ca.start()
            await cb.start()
            try:
                await wait_until(lambda: len(ca.members) == 2 and len(cb.members) == 2
                                 and len(ca.assigned) + len(cb.assigned) == 4
                                 and not set(ca.assigned) & set(cb.assigned), 20,
                                 "both members to share the four queues")
                bodies = [f"job-{i}".encode() for i in range(400)]
                for i in range(0, 400, 40):
                    await asyncio.gather(*(producer.send(Message("jobs", x)) for x in bodies[i:i + 40]))
                await wait_until(lambda: len(a.seen) + len(b.seen) >= 400, 30, "every job consumed")
            finally:
                await ca.close()
                await cb.close()
            got = [m.body for m in a.seen + b.seen]
            assert sorted(got) == sorted(bodies), "every message exactly once"
            assert a.seen and b.seen, "both members consumed"
            per_queue: dict = defaultdict(list)
            for m in a.seen + b.seen:
                per_queue[m.queue].append(m.queue_offset)
            assert all(len(v) == len(set(v)) for v in per_queue.values())

    _with_cluster(tmp_path, run)


def test_broadcasting_members_each_read_everything(tmp_path: Path) -> None:
    async def run(ns: str) -> None:
        async with Producer(ns) as producer:
            await producer.send(Message("news", b"first"))
            r1, r2 = Recorder(), Recorder()
            consumers = [PushConsumer(ns, "readers", r, model="broadcasting", start_from="first",
                                      heartbeat_s=0.3, suspend_ms=500, client_id=f"reader-{k}",
                                      offset_store_dir=tmp_path / "offsets")
                         for k, r in enumerate((r1, r2))]
            for c in consumers:
                c.subscribe("news")
                await c.start()
            try:
                for i in range(20):
                    await producer.send(Message("news", f"n{i}".encode()))
                await wait_until(lambda: len(r1.seen) >= 21 and len(r2.seen) >= 21, 20,
                                 "both readers to see every message")
            finally:
                for c in consumers:
                    await c.close()
            assert sorted(m.body for m in r1.seen) == sorted(m.body for m in r2.seen)

    _with_cluster(tmp_path, run)


def test_a_group_can_start_from_a_timestamp(tmp_path: Path) -> None:
    """RocketMQ's CONSUME_FROM_TIMESTAMP: a new group starts each queue at the first message
    stored at or after a time, so it sees exactly what was stored since."""
    async def run(ns: str) -> None:
        async with Producer(ns) as producer, PullConsumer(ns, "probe") as probe:
            for i in range(12):
                await producer.send(Message("audit", f"old{i}".encode()))
            queues = await probe.fetch_queues("audit")
            old = {mq: (await probe.pull(mq, 0, 100)).messages for mq in queues}
            since_ms = max(m.store_ts_ms for ms in old.values() for m in ms) + 1
            await wait_until(lambda: time.time() * 1000 > since_ms + 1, 5, "the clock to pass it")
            new = {f"new{i}".encode() for i in range(12)}
            for body in sorted(new):
                await producer.send(Message("audit", body))
            for mq in queues:  # each queue's first new message: right after its old ones
                assert await probe.offset_for_timestamp(mq, since_ms) == len(old[mq])
            recorder = Recorder()
            consumer = PushConsumer(ns, "auditors", recorder, start_from="timestamp",
                                    start_timestamp_ms=since_ms, heartbeat_s=0.3, suspend_ms=500)
            consumer.subscribe("audit")
            await consumer.start()
            try:
                await wait_until(lambda: len(recorder.seen) >= len(new), 20, "the new messages")
            finally:
                await consumer.close()
            assert {m.body for m in recorder.seen} == new

    _with_cluster(tmp_path, run)


def test_start_from_timestamp_needs_its_time() -> None:
    with pytest.raises(ValueError):
        PushConsumer("127.0.0.1:1", "g", Recorder(), start_from="timestamp")
    with pytest.raises(ValueError):
        PushConsumer("127.0.0.1:1", "g", Recorder(), start_from="last", start_timestamp_ms=5)
