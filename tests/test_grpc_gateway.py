"""RocketMQ 5 clients against the brokers' gRPC endpoint (issue 20): the unmodified PyPI client
``rocketmq-python-client`` sends to a NameServer and a 3-node group started as ``dledger up``
starts them (every node with ``--grpc-listen``), and our own client reads what it sent.

The RocketMQ client is synchronous (it runs its own threads and event loop); each test drives it
from the test's thread and our asyncio client with ``asyncio.run``."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
from rocketmq import ClientConfiguration, Credentials, Message as RmqMessage, Producer as RmqProducer

from client import Message, Producer, PullConsumer, ReceivedMessage
from tests.clusters import namesrv_group

pytestmark = pytest.mark.slow


def grpc_endpoints(ns: str) -> str:
    """Every node's gRPC address as the NameServer lists it: what a user gives the client."""
    with urllib.request.urlopen(f"http://{ns}/v1/cluster", timeout=5) as resp:
        groups = json.loads(resp.read())["groups"]
    return ";".join(n["grpc_address"] for g in groups for n in g["nodes"] if "grpc_address" in n)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, str]]:
    with namesrv_group(tmp_path, "--grpc-listen", "127.0.0.1:0") as (ns, _group):
        deadline = time.monotonic() + 30
        while grpc_endpoints(ns).count(";") < 2:
            assert time.monotonic() < deadline, "the nodes' gRPC addresses were not registered"
            time.sleep(0.1)  # (polling the NameServer: a condition with a deadline)
        yield ns, grpc_endpoints(ns)


def rmq_producer(endpoints: str, topics: list[str]) -> RmqProducer:
    producer = RmqProducer(ClientConfiguration(endpoints, Credentials()), topics)
    producer.startup()
    return producer


async def read_all(ns: str, topic: str, count: int, timeout_s: float = 20) -> list[ReceivedMessage]:
    """``count`` messages of ``topic`` read with our own client, from every queue's start."""
    got: list[ReceivedMessage] = []
    async with PullConsumer(ns, "interop-reader") as consumer:
        deadline = time.monotonic() + timeout_s
        while len(got) < count:
            assert time.monotonic() < deadline, f"read {len(got)} of {count}"
            got = []
            for mq in await consumer.fetch_queues(topic):
                offset = 0
                while True:
                    res = await consumer.pull(mq, offset, 64)
                    got.extend(res.messages)
                    if res.next_offset >= res.max_offset or not res.messages:
                        break
                    offset = res.next_offset
            if len(got) < count:
                await asyncio.sleep(0.05)
    return got


def _props(m: ReceivedMessage) -> dict[str, str]:
    return dict(m.properties)


def test_rocketmq_producer_sends_normal_fifo_and_delay_messages_that_our_client_reads_intact(
        cluster: tuple[str, str]) -> None:
    ns, endpoints = cluster
    producer = rmq_producer(endpoints, ["interop"])
    try:
        sent: dict[str, Any] = {}
        m = RmqMessage()
        m.topic, m.body, m.tag = "interop", b"normal-1", "TagA"
        m.keys = "k1"  # (the client's setter adds one key to the message's set)
        m.keys = "k2"
        m.add_property("color", "red")
        m.add_property("size", "L")
        sent["normal-1"] = producer.send(m)
        for i in range(6):
            f = RmqMessage()
            f.topic, f.body, f.tag = "interop", b"fifo-%d" % i, "TagF"
            f.message_group = "order-7"
            sent[f"fifo-{i}"] = producer.send(f)
        d = RmqMessage()
        d.topic, d.body = "interop", b"delay-1"
        d.delivery_timestamp = int(time.time() * 1000) + 1500  # (the client's unit: ms)
        sent["delay-1"] = producer.send(d)
    finally:
        producer.shutdown()
    assert all(r.message_id for r in sent.values())

    got = {m.body.decode(): m for m in asyncio.run(read_all(ns, "interop", len(sent)))}
    assert set(got) == set(sent)
    normal = got["normal-1"]
    assert normal.tags == "TagA" and sorted(normal.keys) == ["k1", "k2"]
    assert _props(normal)["color"] == "red" and _props(normal)["size"] == "L"
    assert normal.msg_id == sent["normal-1"].message_id  # the client's id is the unique key
    assert normal.born_ts_ms > 0 and "__BORNHOST" in _props(normal)
    fifo = [got[f"fifo-{i}"] for i in range(6)]
    assert len({(m.queue.group, m.queue.queue_id) for m in fifo}) == 1  # one group, one queue
    assert [m.queue_offset for m in fifo] == sorted(m.queue_offset for m in fifo)
    assert all(_props(m)["__SHARDINGKEY"] == "order-7" for m in fifo)
    delayed = got["delay-1"]
    assert delayed.store_ts_ms >= int(_props(delayed)["TIMER_DELIVER_MS"]) - 50


def test_a_send_refused_by_the_gateway_comes_back_as_the_protocols_error(
        cluster: tuple[str, str]) -> None:
    _, endpoints = cluster
    producer = rmq_producer(endpoints, ["refusals"])
    try:
        bad = RmqMessage()
        bad.topic, bad.body = "refusals", b"x"
        bad.add_property("UNIQ_KEY", "forged")  # a name the broker gives a meaning of its own
        with pytest.raises(Exception, match="reserved"):
            producer.send(bad)
        ok = RmqMessage()
        ok.topic, ok.body = "refusals", b"fine"
        assert producer.send(ok).message_id
    finally:
        producer.shutdown()


def test_our_producer_and_the_rocketmq_producer_share_a_topic(cluster: tuple[str, str]) -> None:
    ns, endpoints = cluster

    async def ours() -> None:
        async with Producer(ns) as p:
            for i in range(3):
                await p.send(Message("shared", b"ours-%d" % i))
    asyncio.run(ours())
    producer = rmq_producer(endpoints, ["shared"])
    try:
        for i in range(3):
            m = RmqMessage()
            m.topic, m.body = "shared", b"theirs-%d" % i
            producer.send(m)
    finally:
        producer.shutdown()
    bodies = sorted(m.body for m in asyncio.run(read_all(ns, "shared", 6)))
    assert bodies == sorted([b"ours-%d" % i for i in range(3)] + [b"theirs-%d" % i for i in range(3)])
