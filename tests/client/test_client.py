"""The client library end to end: a NameServer, a 3-node broker group, producers and a pull
consumer from the library. A leader SIGKILL during sends needs no user code: producers follow
redirects and routes, and no acknowledged message is lost."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from pathlib import Path

import pytest

from client import (
    Message,
    MessageTooLargeError,
    Producer,
    PullConsumer,
    SendTimeoutError,
    SyncProducer,
    SyncPullConsumer,
    TopicNotFoundError,
    UnavailableError,
)
from client.types import MessageQueue
from dledger.localcluster import LocalCluster
from tests.broker.test_broker_processes import BROKER, _start_namesrv
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow


async def drain(consumer: PullConsumer, topic: str) -> dict[MessageQueue, list]:
    out = {}
    for mq in await consumer.fetch_queues(topic):
        msgs: list = []
        offset = 0
        for _ in range(10_000):
            res = await consumer.pull(mq, offset, 256)
            if not res.messages:
                break
            msgs.extend(res.messages)
            offset = res.next_offset
        out[mq] = msgs
    return out


def test_producers_and_a_pull_consumer_through_a_leader_kill(tmp_path: Path) -> None:
    ns_proc, ns = _start_namesrv(tmp_path)

    async def run(cluster: LocalCluster) -> None:
        async with Producer(ns) as p1, Producer(ns) as p2, PullConsumer(ns, "cg") as consumer:
            acked: dict[str, tuple[MessageQueue, int]] = {}
            failures: list[Exception] = []
            stop = asyncio.Event()

            async def produce(p: Producer, name: str) -> None:
                for seq in range(100_000):
                    if stop.is_set():
                        return
                    try:
                        r = await p.send(Message("events", f"{name}-{seq}".encode(), tags="t"))
                    except SendTimeoutError as err:  # outcome unknown: not acknowledged
                        failures.append(err)
                        continue
                    acked[f"{name}-{seq}"] = (r.queue, r.queue_offset)

            tasks = [asyncio.create_task(produce(p, n)) for p, n in ((p1, "a"), (p2, "b"))]
            await wait_until(lambda: len(acked) >= 200, 30, "acks before the kill")
            leader = next(n for n, s in cluster.servers.items()
                          if s.running and _is_leader(cluster, n))
            cluster.kill(leader)
            n = len(acked)
            await wait_until(lambda: len(acked) >= n + 200, 30, "acks after the kill")
            cluster.restart(leader)
            stop.set()
            await asyncio.gather(*tasks)
            got = await drain(consumer, "events")
            stored = {m.body.decode(): (mq, m.queue_offset) for mq, ms in got.items() for m in ms}
            lost = [v for v in acked if v not in stored]
            assert not lost, f"{len(lost)} acknowledged messages lost: {lost[:5]}"
            assert all(stored[v] == where for v, where in acked.items())
            assert len(failures) <= 5, failures  # a few sends may straddle the election
            # offsets committed to the broker survive a consumer restart
            mq = sorted(got)[0]
            await consumer.commit(mq, len(got[mq]))
        async with PullConsumer(ns, "cg") as again:
            assert await again.committed(mq) == len(got[mq])
            assert await again.committed(MessageQueue("events", mq.group, 99)) == -1

    try:
        with LocalCluster(str(tmp_path), size=3, tick_ms=50,
                          program=(*BROKER, "--namesrv", ns, "--register-interval-s", "1")) as c:
            asyncio.run(run(c))
    finally:
        ns_proc.terminate()
        ns_proc.wait(timeout=10)


def _is_leader(cluster: LocalCluster, node: str) -> bool:
    """Asked from a thread: the test's own event loop is busy running the producers."""
    from dledger.client import LogClient
    from protocol import broker_kinds as bp

    async def ask() -> bool:
        async with LogClient(cluster.client_addresses, timeout_s=2) as c:
            return (await c.call(node, bp.BROKER_STATUS))["raft"]["role"] == "leader"

    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(lambda: asyncio.run(ask())).result(10)


def test_sync_twins_batches_and_named_errors(tmp_path: Path) -> None:
    ns_proc, ns = _start_namesrv(tmp_path)
    try:
        with LocalCluster(str(tmp_path), size=3, tick_ms=50,
                          program=(*BROKER, "--namesrv", ns, "--register-interval-s", "1")):
            producer = SyncProducer(ns)
            consumer = SyncPullConsumer(ns, "g")
            try:
                results = _retry_until_routed(lambda: producer.send_batch(
                    [Message("batch", b"m%d" % i) for i in range(10)]))
                assert [r.queue_offset for r in results] == list(range(10))
                assert len({r.queue for r in results}) == 1  # one batch, one queue, one entry
                mq = results[0].queue
                _retry_until_routed(lambda: consumer.fetch_queues("batch"), TopicNotFoundError)
                pulled = consumer.pull(mq, 0, 100)
                assert [m.body for m in pulled.messages] == [b"m%d" % i for i in range(10)]
                with pytest.raises(MessageTooLargeError):
                    producer.send(Message("batch", b"x" * (4 * 1024 * 1024 + 1)))
                asyncio.run(_concurrent_sends_share_a_request(ns))
            finally:
                producer.close()
                consumer.close()
    finally:
        ns_proc.terminate()
        ns_proc.wait(timeout=10)


async def _concurrent_sends_share_a_request(ns: str) -> None:
    """Sends made in one loop turn travel as one request (client-side group commit) yet each
    message gets its own queue: each caller still gets its own result, and a bad message fails
    only its own caller."""
    async with Producer(ns) as p:
        sends = [p.send(Message("batch", b"c%d" % i)) for i in range(40)]
        too_large = p.send(Message("batch", b"x" * (4 * 1024 * 1024 + 1)))
        *ok, refused = await asyncio.gather(*sends, too_large, return_exceptions=True)
    assert isinstance(refused, MessageTooLargeError)
    assert all(r.status == "SEND_OK" for r in ok)
    assert len({r.queue for r in ok}) == 4  # round robin over the queues, per message
    assert len({r.offset_msg_id.rsplit("-", 1)[0] for r in ok}) == 1  # one request, one entry
    for q in {r.queue for r in ok}:
        offsets = [r.queue_offset for r in ok if r.queue == q]
        assert offsets == list(range(offsets[0], offsets[0] + 10))  # in call order
    assert len({r.msg_id for r in ok}) == 40 and len({r.offset_msg_id for r in ok}) == 40


def _retry_until_routed(fn, error: type[Exception] = UnavailableError):
    """Waits (with a deadline) for the brokers' registration at the NameServer to show."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return fn()
        except error:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # polling the NameServer until the route shows


def test_start_fails_fast_without_a_namesrv() -> None:
    async def run() -> None:
        with pytest.raises(UnavailableError):
            await Producer("127.0.0.1:1").start()
    asyncio.run(run())
