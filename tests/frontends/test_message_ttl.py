"""Per-message TTL (issue 35, item 5, and the bar's "a message whose TTL passed is never
delivered"; ``protocol.message_ttl``): messages sent with a short TTL by our client
(``Message(ttl_ms=...)``) and by the official RocketMQ 5 client (the ``TTL_MS`` user property)
to a one-queue topic nobody consumes yet are, once the TTL has passed, delivered by no path:
our pull, our push consumer, the gRPC SimpleConsumer (POP) and a raw POP_RECEIVE; messages sent
with them without a TTL, or with a long one, are. The reads count what they passed in the
broker's status and in /metrics. A bad TTL is refused by name, by our client and by the
broker."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from typing import Any

import pytest
from rocketmq import Message as RmqMessage

from client import ConsumeStatus, Message, Producer, PushConsumer
from client.types import ReceivedMessage
from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from protocol import broker_kinds as bp
from protocol.message_ttl import TTL_PROPERTY
from tests.frontends.grpc_helpers import (
    _leader_nodes,
    read_all,
    receive_until,
    rmq_producer,
    simple_consumer,
)
from tests.frontends.raw import statuses
from tests.frontends.test_grpc_failover import wait_for
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow

TOPIC = "ttl"
SHORT_MS = 1_500
KEPT = {b"kept-ours", b"long-ours", b"kept-theirs", b"long-theirs"}


def theirs(body: bytes, ttl_ms: int | None) -> RmqMessage:
    m = RmqMessage()
    m.topic, m.body = TOPIC, body
    if ttl_ms is not None:
        m.add_property(TTL_PROPERTY, str(ttl_ms))
    return m


async def push_consume(ns: str) -> list[bytes]:
    """What a new push consumer group reads of the one queue, from its first offset, until the
    last message sent (``long-theirs``; the queue is read in order, so all before it passed)."""
    seen: list[ReceivedMessage] = []

    def listener(batch: list[ReceivedMessage]) -> ConsumeStatus:
        seen.extend(batch)
        return ConsumeStatus.SUCCESS
    consumer = PushConsumer(ns, "ttl-push", listener, start_from="first", heartbeat_s=0.3,
                            rebalance_s=1, suspend_ms=500)
    consumer.subscribe(TOPIC)
    async with consumer:
        await wait_until(lambda: any(m.body == b"long-theirs" for m in seen), 30,
                         "the push consumer to reach the last message")
    return [m.body for m in seen]


async def pop_raw(ns: str) -> list[bytes]:
    """A raw POP_RECEIVE of another group (no long poll) at the leader."""
    async with LogClient(await _leader_nodes(ns), timeout_s=5) as client:
        _, rows = await client.call_leader(bp.POP_RECEIVE, "ttl-raw", TOPIC, 0, 32, 60_000, ["*"],
                                        "", 0, 16)
    return [r[2] for r in rows]


def metric_sum(cluster: LocalCluster, name: str) -> float:
    total = 0.0
    for server in cluster.servers.values():
        if server.ready is None or "admin" not in server.ready:
            continue
        host, port = server.ready["admin"]
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith(name + "{"):
                    total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_message_whose_ttl_passed_is_never_delivered(
        module_cluster: tuple[str, str, LocalCluster]) -> None:
    ns, endpoints, cluster = module_cluster

    async def setup_and_send_ours() -> None:
        async with LogClient(await _leader_nodes(ns), timeout_s=5) as client:
            await client.call_leader(bp.TOPIC_PUT, TOPIC, 1, 1, 6)
        async with Producer(ns) as p:
            await p.send(Message(TOPIC, b"short-ours", ttl_ms=SHORT_MS))
            await p.send(Message(TOPIC, b"kept-ours"))
            await p.send(Message(TOPIC, b"long-ours", ttl_ms=3_600_000))
    asyncio.run(setup_and_send_ours())
    producer = rmq_producer(endpoints, [TOPIC])
    try:
        producer.send(theirs(b"short-theirs", SHORT_MS))
        producer.send(theirs(b"kept-theirs", None))
        producer.send(theirs(b"long-theirs", 3_600_000))
    finally:
        producer.shutdown()
    sent_ms = time.time() * 1000  # every store time is before this
    wait_for(lambda: time.time() * 1000 > sent_ms + SHORT_MS + 100, 10, "the TTL to pass")

    pulled = {m.body for m in asyncio.run(read_all(ns, TOPIC, len(KEPT)))}
    assert pulled == KEPT
    pushed = asyncio.run(push_consume(ns))
    assert set(pushed) == KEPT
    assert sorted(asyncio.run(pop_raw(ns))) == sorted(KEPT)
    consumer = simple_consumer(endpoints, "ttl-grpc", TOPIC, await_s=1)
    try:
        received = receive_until(consumer, len(KEPT), 30)
        assert {m.body for m in received} == KEPT
        assert consumer.receive(16, 30) == []  # nothing more (the expired ones included)
    finally:
        consumer.shutdown()
    passed: dict[str, int] = {"pull": 0, "pop": 0}
    for st in statuses(ns).values():
        for path, n in st["expired_passed"].items():
            passed[path] += n
    assert passed["pull"] >= 2 * 2 and passed["pop"] >= 2 * 2  # (each read passed both)
    assert metric_sum(cluster, "dledger_messages_expired_total") == sum(passed.values())


@pytest.mark.parametrize("value", ["-5", "0", "1.5", "soon", str(10**13)])
def test_a_bad_ttl_is_refused_by_name(module_cluster: tuple[str, str, LocalCluster],
                                      value: str) -> None:
    ns, endpoints, _ = module_cluster

    async def send_raw() -> Any:
        async with LogClient(await _leader_nodes(ns), timeout_s=5) as client:
            await client.call_leader(bp.TOPIC_PUT, "ttl-bad", 1, 1, 6)
            return await client.call_leader(bp.SEND, "ttl-bad", 0,
                                            [[b"x", "", [], "", [[TTL_PROPERTY, value]], 0]])
    with pytest.raises(Exception, match=TTL_PROPERTY):
        asyncio.run(send_raw())
    producer = rmq_producer(endpoints, ["ttl-bad"])
    try:
        with pytest.raises(Exception, match=TTL_PROPERTY):
            producer.send(_bad(value))
    finally:
        producer.shutdown()


def _bad(value: str) -> RmqMessage:
    m = RmqMessage()
    m.topic, m.body = "ttl-bad", b"x"
    m.add_property(TTL_PROPERTY, value)
    return m


@pytest.mark.parametrize("ttl_ms", [-1, 0, 10**13])
def test_our_message_refuses_a_bad_ttl(ttl_ms: int) -> None:
    with pytest.raises(ValueError, match=TTL_PROPERTY):
        Message(TOPIC, b"x", ttl_ms=ttl_ms)
    with pytest.raises(TypeError, match="ttl_ms"):
        Message(TOPIC, b"x", ttl_ms=1.5)  # type: ignore[arg-type]


def test_a_message_in_flight_whose_ttl_passes_is_not_delivered_again(
        module_cluster: tuple[str, str, LocalCluster]) -> None:
    """A POP receive hands a message out before its TTL; not acknowledged, it would come again
    after its invisible time, but its TTL has passed by then: acknowledged instead, never
    delivered again (``broker.features.pop.service``)."""
    ns = module_cluster[0]
    ttl_ms, invisible_ms = 3_000, 1_000

    async def run() -> None:
        async with LogClient(await _leader_nodes(ns), timeout_s=10) as client:
            await client.call_leader(bp.TOPIC_PUT, "ttl-flight", 1, 1, 6)
            await client.call_leader(bp.SEND, "ttl-flight", 0, [
                [b"brief", "", [], "u-brief", [[TTL_PROPERTY, str(ttl_ms)]], 0]])
            sent_ms = time.time() * 1000

            async def pop() -> list[bytes]:
                _, rows = await client.call_leader(bp.POP_RECEIVE, "ttl-flight-g", "ttl-flight",
                                                   0, 8, invisible_ms, ["*"], "", 0, 16)
                return [r[2] for r in rows]
            assert await pop() == [b"brief"]  # before its TTL: delivered (not acknowledged)
            await wait_until(lambda: time.time() * 1000 > sent_ms + ttl_ms + 100, 10,
                             "the TTL to pass")
            assert await pop() == []  # due again, but expired: acknowledged, not delivered
            _, status = await client.call_leader(bp.CONSUMER_STATUS, "ttl-flight-g")
            assert status["queues"] == [["ttl-flight", 0, 1, 1]]  # it left flight
    asyncio.run(run())
