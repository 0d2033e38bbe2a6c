"""Priority messages (issue 35, item 4, and the bar's "a high-priority message sent after 1,000
low-priority ones in one queue is received among the first 10"; ``protocol.priority``,
``broker.features.pop.scan``): on a one-queue topic, 1,000 messages of priority 0 from our
producer, then one of a higher priority from the official RocketMQ 5 client (its PRIORITY type)
and one from ours (``Message(priority=...)``): a gRPC SimpleConsumer's first receive of 10
holds both, the higher first; the rest come in send order. Across a leadership transfer, and
across a leader kill, with the low messages parked: none is lost or delivered twice, and a
priority message sent after the change still comes first."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from rocketmq import Message as RmqMessage
from rocketmq import Producer as RmqProducer

from client import Message, Producer
from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from protocol import broker_kinds as bp
from protocol.priority import PRIORITY_PROPERTY
from tests.frontends.grpc_helpers import (
    _leader_nodes,
    rmq_producer,
    simple_consumer,
)
from tests.frontends.raw import statuses
from tests.frontends.test_grpc_failover import kill_the_leader, wait_for

pytestmark = pytest.mark.slow

LOW = 1_000


def low_ones_sent(ns: str, endpoints: str, topic: str) -> RmqProducer:
    """A one-queue topic holding LOW messages of priority 0 (one batch: stored in send order),
    and an official client's producer for it."""
    async def put_and_send() -> None:
        async with LogClient(await _leader_nodes(ns), timeout_s=5) as client:
            await client.call_leader(bp.TOPIC_PUT, topic, 1, 1, 6)
        async with Producer(ns) as p:
            await p.send_batch([Message(topic, b"low-%04d" % i) for i in range(LOW)])
    asyncio.run(put_and_send())
    return rmq_producer(endpoints, [topic])


def theirs(topic: str, body: bytes, priority: int) -> RmqMessage:
    m = RmqMessage()
    m.topic, m.body = topic, body
    m.priority = priority
    return m


def test_a_high_priority_message_after_1000_low_ones_comes_among_the_first_10(
        module_cluster: tuple[str, str, LocalCluster]) -> None:
    ns, endpoints, _ = module_cluster
    topic = "prio"
    producer = low_ones_sent(ns, endpoints, topic)
    try:
        producer.send(theirs(topic, b"high-theirs", 5))
    finally:
        producer.shutdown()

    async def send_ours() -> None:
        async with Producer(ns) as p:
            await p.send(Message(topic, b"higher-ours", priority=9))
    asyncio.run(send_ours())
    consumer = simple_consumer(endpoints, "prio-grpc", topic, await_s=1)
    try:
        first = consumer.receive(10, 60)
        bodies = [m.body for m in first]
        assert bodies[:2] == [b"higher-ours", b"high-theirs"]
        assert [m.priority for m in first[:2]] == [9, 5]
        assert bodies[2:] == [b"low-%04d" % i for i in range(len(bodies) - 2)]  # send order
        for m in first:
            consumer.ack(m)
        rest = receive_acked(consumer, LOW + 2 - len(first), 90)
        assert rest == [b"low-%04d" % i for i in range(len(bodies) - 2, LOW)]
    finally:
        consumer.shutdown()


def test_a_bad_priority_is_refused_by_name(module_cluster: tuple[str, str, LocalCluster]
                                           ) -> None:
    ns = module_cluster[0]
    for bad in (-1, 10, "2"):
        with pytest.raises((ValueError, TypeError), match=r"(?i)priority"):
            Message("prio", b"x", priority=bad)  # type: ignore[arg-type]

    async def send_raw(value: str) -> None:
        async with LogClient(await _leader_nodes(ns), timeout_s=5) as client:
            await client.call_leader(bp.SEND, "prio", 0,
                                     [[b"x", "", [], "", [[PRIORITY_PROPERTY, value]], 0]])
    for value in ("-1", "10", "high", "1.5"):
        with pytest.raises(Exception, match=PRIORITY_PROPERTY):
            asyncio.run(send_raw(value))


def until_done(call: Any, timeout_s: float, what: str, empty_ok: bool = False) -> Any:
    """``call()`` again while it fails (no leader yet, or the client chose the node killed) or
    answers nothing, up to the deadline; each try blocks in the client for its own timeout or
    long poll."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            out = call()
            if out or empty_ok:
                return out
        except Exception:
            if time.monotonic() > deadline:
                raise
        assert time.monotonic() < deadline, f"timed out waiting for {what}"


def receive_acked(consumer: Any, count: int, timeout_s: float) -> list[bytes]:
    """Every message until ``count``, each acknowledged, their bodies in receive order; a
    receive or ack tried again while the group has no leader or the client chose a node
    killed."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        assert time.monotonic() < deadline, f"received {len(got)} of {count}"
        for m in until_done(lambda: consumer.receive(16, 60), 60, "a receive"):
            until_done(lambda m=m: consumer.ack(m), 30, "an ack", empty_ok=True)
            got.append(m.body)
    return got


def transfer_leadership(ns: str) -> None:
    async def transfer() -> str:
        async with LogClient(await _leader_nodes(ns), timeout_s=10) as client:
            leader, _ = await client.call_leader(bp.BROKER_STATUS)
            target = next(n for n in sorted(await _leader_nodes(ns)) if n != leader)
            await client.call_leader(bp.TRANSFER_LEADERSHIP, target)
            return target
    target = asyncio.run(transfer())
    wait_for(lambda: statuses(ns).get(target, {}).get("raft", {}).get("role") == "leader",
             30, "the new leader")


@pytest.mark.parametrize("change", ["transfer", "kill"])  # (the kill last: the module's end)
def test_priority_across_a_leader_change_loses_nothing(
        module_cluster: tuple[str, str, LocalCluster], change: str) -> None:
    ns, endpoints, cluster = module_cluster
    topic = f"prio-{change}"
    producer = low_ones_sent(ns, endpoints, topic)
    consumer = simple_consumer(endpoints, topic, topic, await_s=1)
    try:
        producer.send(theirs(topic, b"high-1", 5))
        first = consumer.receive(10, 60)  # the low ones passed are parked (replicated)
        assert first[0].body == b"high-1"
        for m in first:
            consumer.ack(m)
        if change == "kill":
            kill_the_leader(cluster)  # SIGKILL
        else:
            transfer_leadership(ns)
        until_done(lambda: producer.send(theirs(topic, b"high-2", 5)), 60, "a send")
        after = until_done(lambda: consumer.receive(10, 60), 60, "a receive")
        assert after[0].body == b"high-2"  # the new leader orders by priority too
        for m in after:
            until_done(lambda m=m: consumer.ack(m), 30, "an ack", empty_ok=True)
        rest = receive_acked(consumer, LOW + 2 - len(first) - len(after), 120)
        every = [m.body for m in first] + [m.body for m in after] + rest
        assert sorted(every) == sorted([b"low-%04d" % i for i in range(LOW)]
                                       + [b"high-1", b"high-2"])  # none lost, none twice
    finally:
        consumer.shutdown()
        producer.shutdown()
