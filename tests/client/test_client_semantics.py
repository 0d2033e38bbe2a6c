"""Client library semantics on real processes (a NameServer and a 3-node group shared by the tests
of this module, each on its own topics), issue 16: a pull right after the first send of a new
topic finds it (item 2); an empty tag expression means ``*`` (13); a broadcasting consumer keeps
its progress in a local file, resumes from it, and does not retry a failed message (14); the
named errors of a client used before start() or after close(), ``with`` on the blocking twins and
the blocking push consumer (17)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from client import (
    ClientClosedError,
    ClientNotStartedError,
    ConsumeStatus,
    Message,
    OffsetStoreLockedError,
    Producer,
    PullConsumer,
    PushConsumer,
    SyncProducer,
    SyncPullConsumer,
    SyncPushConsumer,
)
from client.types import ReceivedMessage
from dledger.localcluster import LocalCluster
from tests.broker.test_broker_processes import BROKER, _start_namesrv
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow

FAST = {"heartbeat_s": 0.3, "rebalance_s": 1.0, "commit_s": 0.3, "suspend_ms": 300}


@pytest.fixture(scope="module")
def ns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    base = tmp_path_factory.mktemp("cluster")
    ns_proc, addr = _start_namesrv(base)
    try:
        with LocalCluster(str(base), size=3, tick_ms=50,
                          program=(*BROKER, "--namesrv", addr, "--register-interval-s", "1")):
            asyncio.run(_registered(addr))
            yield addr
    finally:
        ns_proc.terminate()
        ns_proc.wait(timeout=10)


async def _registered(addr: str) -> None:
    """Until the NameServer routes the group's leader (a cluster that just started registers
    within a second or two)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        async def led() -> bool:
            async with session.get(f"http://{addr}/v1/cluster") as resp:
                groups = (await resp.json())["groups"]
            return bool(groups) and all(g.get("leader") for g in groups)
        await wait_until(led, 30, "the group's registration")


class Deliveries:
    """A listener that records every delivery (successful or not) and fails some bodies once."""

    def __init__(self, fail_once: set[bytes] | None = None) -> None:
        self.delivered: list[ReceivedMessage] = []
        self.fail_once = set(fail_once or ())
        self.lock = threading.Lock()  # the sync push consumer calls it from its own thread

    def __call__(self, batch: list[ReceivedMessage]) -> ConsumeStatus:
        with self.lock:
            self.delivered.extend(batch)
            if any(m.body in self.fail_once for m in batch):
                self.fail_once -= {m.body for m in batch}
                return ConsumeStatus.LATER
        return ConsumeStatus.SUCCESS

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for m in self.delivered]


def test_a_pull_right_after_the_first_send_of_a_new_topic_finds_it(ns: str) -> None:
    async def run() -> None:
        async with Producer(ns) as producer, PullConsumer(ns, "early") as consumer:
            assert await consumer.groups("fresh") == []  # asked before it exists: not served
            sent = await producer.send(Message("fresh", b"first"))  # auto-creates it
            got = await consumer.pull(sent.queue, 0)  # the route shows up a moment later
            assert [m.body for m in got.messages] == [b"first"]
            assert await consumer.committed(sent.queue) == -1  # every call through _call waits
    asyncio.run(run())


def test_an_empty_tag_expression_means_every_tag(ns: str) -> None:
    async def run() -> None:
        async with Producer(ns) as producer:
            await producer.send(Message("tagged", b"warm-up"))
            listeners = {expr: Deliveries() for expr in ("", None)}
            consumers = []
            for k, (expr, listener) in enumerate(listeners.items()):
                c = PushConsumer(ns, f"tags-{k}", listener, start_from="first", **FAST)
                c.subscribe("tagged", expr)
                consumers.append(await c.start())
            try:
                for body, tags in ((b"a", "TagA"), (b"none", ""), (b"b", "TagB")):
                    await producer.send(Message("tagged", body, tags=tags))
                want = {b"warm-up", b"a", b"none", b"b"}
                await wait_until(lambda: all(want <= set(x.bodies()) for x in listeners.values()),
                                 20, "every tag delivered to both")
            finally:
                for c in consumers:
                    await c.close()
    asyncio.run(run())


def _stored(path: Path) -> dict[tuple[str, int], int]:
    doc = json.loads(path.read_text())
    return {(r["broker_group"], r["queue_id"]): r["offset"] for r in doc["offsets"]}


def test_a_broadcasting_consumer_resumes_from_its_local_file(ns: str, tmp_path: Path) -> None:
    def member(listener: Deliveries) -> PushConsumer:
        c = PushConsumer(ns, "readers", listener, model="broadcasting", start_from="first",
                         client_id="member-1", offset_store_dir=tmp_path, **FAST)
        c.subscribe("bcast")
        return c

    async def run() -> None:
        async with Producer(ns) as producer:
            old = [b"old-%d" % i for i in range(8)]
            for body in old:  # one request each: round robin spreads them over the queues
                await producer.send(Message("bcast", body))
            first = Deliveries()
            async with member(first):
                await wait_until(lambda: set(old) <= set(first.bodies()), 20, "the old messages")
                with pytest.raises(OffsetStoreLockedError):  # same id, group and directory
                    await member(Deliveries()).start()
            stored = _stored(tmp_path / "member-1" / "readers.json")
            assert sum(stored.values()) == len(old)
            new = [b"new-%d" % i for i in range(4)]
            for body in new:
                await producer.send(Message("bcast", body))
            again = Deliveries()
            async with member(again):
                await wait_until(lambda: set(new) <= set(again.bodies()), 20, "the new messages")
            assert not set(old) & set(again.bodies()), "a restarted member read old messages again"
            for m in again.delivered:  # per queue, in order: it started at the stored offset
                assert m.queue_offset >= stored[(m.queue.group, m.queue.queue_id)], m
            assert sum(_stored(tmp_path / "member-1" / "readers.json").values()) == len(old) + len(new)
    asyncio.run(run())


def test_broadcasting_does_not_retry_a_failed_message(ns: str, tmp_path: Path) -> None:
    async def run() -> None:
        async with Producer(ns) as producer:
            await producer.send(Message("bfail", b"warm-up"))
            listener = Deliveries(fail_once={b"fails"})
            c = PushConsumer(ns, "bfail-readers", listener, model="broadcasting",
                             start_from="first", client_id="m", offset_store_dir=tmp_path,
                             later_delay_s=0.0, **FAST)
            c.subscribe("bfail")
            async with await c.start():
                await producer.send(Message("bfail", b"fails"))
                await wait_until(lambda: b"fails" in listener.bodies(), 20, "the failing message")
                await producer.send(Message("bfail", b"after"))  # later_delay_s=0: a retry
                await wait_until(lambda: b"after" in listener.bodies(), 20, "the next message")
            assert listener.bodies().count(b"fails") == 1, listener.bodies()
            assert sum(_stored(tmp_path / "m" / "bfail-readers.json").values()) == 3
    asyncio.run(run())


def test_a_client_used_out_of_turn_raises_a_named_error_at_once(ns: str) -> None:
    async def run() -> None:
        producer = Producer(ns)
        with pytest.raises(ClientNotStartedError):
            await producer.send(Message("turns", b"x"))
        with pytest.raises(ClientNotStartedError):
            producer.send_oneway(Message("turns", b"x"))
        consumer = PullConsumer(ns, "turns")
        with pytest.raises(ClientNotStartedError):
            await consumer.fetch_queues("turns")
        await producer.start()
        await producer.start()  # a second start does nothing
        r = await producer.send(Message("turns", b"x"))
        await producer.close()
        await producer.close()  # nor a second close
        with pytest.raises(ClientClosedError):
            await producer.send(Message("turns", b"x"))
        with pytest.raises(ClientClosedError):
            await producer.send_batch([Message("turns", b"x")])
        with pytest.raises(ClientClosedError):
            await producer.start()  # a closed client does not restart
        async with consumer:
            assert (await consumer.pull(r.queue, 0)).messages[0].body == b"x"
        with pytest.raises(ClientClosedError):
            await consumer.pull(r.queue, 0)
    asyncio.run(run())


def test_the_blocking_twins_are_context_managers_and_the_push_consumer_has_one(ns: str) -> None:
    with SyncProducer(ns) as producer:
        r = producer.send(Message("blocking", b"one"))
    with pytest.raises(ClientClosedError):  # at once: the private loop is gone
        producer.send(Message("blocking", b"two"))
    with SyncPullConsumer(ns, "blocking-pull") as puller:
        assert [m.body for m in puller.pull(r.queue, 0).messages] == [b"one"]
    with pytest.raises(ClientClosedError):
        puller.pull(r.queue, 0)

    listener = Deliveries()
    threads: list[str] = []

    def on_messages(batch: list[ReceivedMessage]) -> ConsumeStatus:
        threads.append(threading.current_thread().name)
        return listener(batch)

    consumer = SyncPushConsumer(ns, "blocking-push", on_messages, start_from="first", **FAST)
    consumer.subscribe("blocking")
    with pytest.raises(ClientNotStartedError):
        _ = consumer.assigned
    with consumer:
        assert consumer.assigned  # the topic's queues, read on the consumer's own loop
        with SyncProducer(ns) as producer:
            producer.send(Message("blocking", b"three"))
        asyncio.run(wait_until(lambda: b"three" in listener.bodies(), 20, "the push delivery"))
    assert set(listener.bodies()) == {b"one", b"three"}
    assert threads and set(threads) == {"dledger-client"}  # the private loop's thread
    with pytest.raises(ClientClosedError):
        consumer.start()
