"""The official RocketMQ 5 Node.js client (npm ``rocketmq-client-nodejs`` 1.0.8, ``make clients``;
driven by ``rmq5_node_client.js``) against a NameServer and a 3-node group serving gRPC, given
one node's address as its users give it: its Producer (normal, FIFO, delay and transaction
messages, a transaction checker), SimpleConsumer and PushConsumer, each asserting what arrived;
messages crossing between it, the official Python client and our own client intact.

What it needs of the endpoint, and the reasons it failed before: route entries of one address
each (it joins an ``Endpoints``' addresses into one gRPC target, ``dns:h1:p1,h2:p2``, which its
resolver refuses), and a body digest as RocketMQ's proxy gives it (MD5 in hex: a CRC32 it reads
as a decimal number, so it marked every message corrupted and its PushConsumer dropped them).

One cluster for the module (``module_cluster``), each test on topics of its own; the last test
kills the leader."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from rocketmq import Message as RmqMessage
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as sv
from rocketmq.grpc_protocol import service_pb2_grpc as sg
from rocketmq.v5.client.balancer.queue_selector import QueueSelector
from rocketmq.v5.model import TopicRouteData

from client import Message
from dledger.localcluster import LocalCluster
from tests.frontends.grpc_helpers import (
    read_all,
    rmq_producer,
    send_ours,
    simple_consumer,
)
from tests.remoting.clients import finish, read_until, rmq5_node, rmq5_node_installed

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("grpc-node")]

Cluster = tuple[str, str, LocalCluster]


def _nodes(ns: str) -> tuple[dict[str, str], str]:
    """Every node's gRPC address by node id, and the leader's id, as the NameServer lists them."""
    with urllib.request.urlopen(f"http://{ns}/v1/cluster", timeout=5) as resp:
        (group,) = json.loads(resp.read())["groups"]
    return {n["node_id"]: n["grpc_address"] for n in group["nodes"]}, group["leader"]


def _access_point(ns: str) -> str:
    """The one address the Node.js client is given (its endpoints string takes one: a list
    of several becomes one gRPC target too): the leader's."""
    nodes, leader = _nodes(ns)
    return nodes[leader]


def _produce(home: Path, endpoints: str, topic: str, spec: list[dict[str, Any]],
             timeout_s: float = 30) -> list[dict[str, Any]]:
    events = finish(rmq5_node(home, "produce", endpoints, topic, json.dumps(spec),
                              str(timeout_s)), timeout_s + 30)
    sends = [e for e in events if "i" in e]
    assert [e["i"] for e in sends] == list(range(len(spec))), events
    assert not [e for e in sends if "error" in e], events
    return events


def _messages(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The Node consumer's messages by body, each received once and not corrupted."""
    got = [e for e in events if "body" in e]
    assert len({m["body"] for m in got}) == len(got), f"a message came twice: {got}"
    assert not [m for m in got if m["corrupted"]], "the client found a body's digest wrong"
    return {m["body"]: m for m in got}


def test_the_route_gives_each_node_its_own_endpoints_and_clients_use_every_node(
        module_cluster: Cluster) -> None:
    """QueryRoute: each queue once per node, each entry one address and broker id 0 (the
    master entries the Java, Python, Go and C# clients keep); the Python client's producer
    selector spreads over all three nodes."""
    ns, _, _ = module_cluster
    nodes, _ = _nodes(ns)
    channel = grpc.insecure_channel(_access_point(ns))
    try:
        request = sv.QueryRouteRequest()
        request.topic.name = "node-route"
        answer = sg.MessagingServiceStub(channel).QueryRoute(
            request, timeout=10, metadata=[("x-mq-client-id", "route-test")])
    finally:
        channel.close()
    assert answer.status.code == pb.Code.OK, answer.status
    entries = answer.message_queues
    assert all(len(mq.broker.endpoints.addresses) == 1 for mq in entries), entries[0]
    assert {mq.broker.id for mq in entries} == {0} and {mq.broker.name for mq in entries} == {"a"}
    by_queue: dict[int, list[str]] = {}
    for mq in entries:
        a = mq.broker.endpoints.addresses[0]
        assert mq.broker.endpoints.scheme == pb.AddressScheme.IPv4
        by_queue.setdefault(mq.id, []).append(f"{a.host}:{a.port}")
    assert sorted(by_queue) == [0, 1, 2, 3]
    assert all(sorted(addrs) == sorted(nodes.values()) for addrs in by_queue.values()), by_queue
    selector = QueueSelector.producer_queue_selector(TopicRouteData(entries))
    facades = {q.endpoints.facade for q in selector.all_queues()}
    assert facades == {f"ipv4:{a}" for a in nodes.values()}


def test_node_producer_sends_every_type_and_python_and_ours_read_them_intact(
        module_cluster: Cluster, tmp_path: Path) -> None:
    rmq5_node_installed()
    ns, endpoints, _ = module_cluster
    topic = "node-sent"
    spec: list[dict[str, Any]] = [
        {"body": "normal-1", "tag": "TagA", "keys": ["k1", "k2"],
         "props": {"color": "red", "size": "L"}},
        *({"body": f"fifo-{i}", "tag": "TagF", "group": "order-7"} for i in range(4)),
        {"body": "delay-1", "delay_ms": 1500, "props": {"late": "yes"}},
        {"body": "txn-commit", "txn": "commit"},
        {"body": "txn-rollback", "txn": "rollback"},
        {"body": "txn-check", "txn": "check"},
    ]
    events = _produce(tmp_path, _access_point(ns), topic, spec)
    assert {"checked": "txn-check"} in events  # the broker asked; the checker committed it
    ids = {spec[e["i"]]["body"]: e["msg_id"] for e in events if "i" in e}
    stored = {s["body"] for s in spec} - {"txn-rollback"}

    ours = {m.body.decode(): m for m in asyncio.run(read_all(ns, topic, len(stored)))}
    assert set(ours) == stored  # the rolled-back one never stored
    normal = ours["normal-1"]
    assert normal.tags == "TagA" and sorted(normal.keys) == ["k1", "k2"]
    assert set(normal.properties) >= {("color", "red"), ("size", "L")}
    assert all(ours[b].msg_id == ids[b] for b in stored)  # the client's id is the unique key
    fifo = [ours[f"fifo-{i}"] for i in range(4)]
    assert len({(m.queue.group, m.queue.queue_id) for m in fifo}) == 1  # one queue, in order
    assert [m.queue_offset for m in fifo] == sorted(m.queue_offset for m in fifo)
    assert all(dict(m.properties)["__SHARDINGKEY"] == "order-7" and m.tags == "TagF"
               for m in fifo)
    delayed = ours["delay-1"]
    deliver_ms = int(dict(delayed.properties)["TIMER_DELIVER_MS"])
    assert delayed.store_ts_ms >= deliver_ms - 50 and deliver_ms - delayed.born_ts_ms >= 1000

    consumer = simple_consumer(endpoints, "node-sent-py", topic)
    try:  # (acking as it goes: a FIFO group's next message comes once the previous is acked)
        theirs: dict[str, Any] = {}
        deadline = time.monotonic() + 30
        while len(theirs) < len(stored):
            assert time.monotonic() < deadline, f"received {sorted(theirs)}"
            for m in consumer.receive(16, 10):
                theirs[m.body.decode()] = m
                consumer.ack(m)
    finally:
        consumer.shutdown()
    assert set(theirs) == stored and not [m for m in theirs.values() if m.corrupted]
    normal_py = theirs["normal-1"]
    assert normal_py.tag == "TagA" and normal_py.keys == {"k1", "k2"}
    assert normal_py.properties == {"color": "red", "size": "L"}
    assert {theirs[f"fifo-{i}"].message_group for i in range(4)} == {"order-7"}
    assert theirs["delay-1"].delivery_timestamp == deliver_ms
    assert theirs["delay-1"].properties == {"late": "yes"}


def test_node_simple_consumer_receives_and_acks_what_python_and_ours_sent(
        module_cluster: Cluster, tmp_path: Path) -> None:
    rmq5_node_installed()
    ns, endpoints, _ = module_cluster
    topic = "node-simple"
    producer = rmq_producer(endpoints, [topic])
    try:
        m = RmqMessage()
        m.topic, m.body, m.tag = topic, b"py-normal", "TagP"
        m.keys = "pk1"
        m.add_property("origin", "python")
        producer.send(m)
        for i in range(3):
            f = RmqMessage()
            f.topic, f.body, f.message_group = topic, b"py-fifo-%d" % i, "g-py"
            producer.send(f)
    finally:
        producer.shutdown()
    send_ours(ns, [Message(topic, b"ours-%d" % i, tags="TagO", keys=[f"ok-{i}"],
                           properties={"origin": "ours", "n": str(i)}) for i in range(3)])

    events = finish(rmq5_node(tmp_path, "simple", _access_point(ns), topic, "node-simple-g",
                              "7", "30", "3000"), 60)
    got = _messages(events)
    assert sorted(got) == sorted(["py-normal", *(f"py-fifo-{i}" for i in range(3)),
                                  *(f"ours-{i}" for i in range(3))])
    py = got["py-normal"]
    assert (py["tag"], py["keys"], py["props"]) == ("TagP", ["pk1"], {"origin": "python"})
    assert {got[f"py-fifo-{i}"]["group"] for i in range(3)} == {"g-py"}
    for i in range(3):
        m = got[f"ours-{i}"]
        assert (m["tag"], m["keys"], m["props"]) == ("TagO", [f"ok-{i}"],
                                                     {"origin": "ours", "n": str(i)})
        assert m["attempt"] == 1 and m["msg_id"]
    assert events[-1] == {"again": 0}  # acked: none came back after the invisible time


def test_node_push_consumer_gets_what_ours_python_and_node_sent(
        module_cluster: Cluster, tmp_path: Path) -> None:
    rmq5_node_installed()
    ns, endpoints, _ = module_cluster
    topic = "node-push"
    send_ours(ns, [Message(topic, b"ours-%d" % i, tags="TagO", keys=[f"ok-{i}"],
                           properties={"n": str(i)}) for i in range(4)])
    producer = rmq_producer(endpoints, [topic])
    try:
        m = RmqMessage()
        m.topic, m.body, m.tag, m.message_group = topic, b"py-fifo", "TagP", "g-push"
        producer.send(m)
    finally:
        producer.shutdown()
    _produce(tmp_path, _access_point(ns), topic,
             [{"body": "node-1", "tag": "TagN", "keys": ["nk"], "props": {"n": "x"}}])

    events = finish(rmq5_node(tmp_path, "push", _access_point(ns), topic, "node-push-g", "6",
                              "40"), 60)
    got = _messages(events)
    assert sorted(got) == ["node-1", "ours-0", "ours-1", "ours-2", "ours-3", "py-fifo"]
    for i in range(4):
        m = got[f"ours-{i}"]
        assert (m["tag"], m["keys"], m["props"]) == ("TagO", [f"ok-{i}"], {"n": str(i)})
    assert (got["py-fifo"]["tag"], got["py-fifo"]["group"]) == ("TagP", "g-push")
    node = got["node-1"]
    assert (node["tag"], node["keys"], node["props"]) == ("TagN", ["nk"], {"n": "x"})
    assert events[-1] == {"done": 6}


def test_with_the_leader_down_clients_reach_the_live_nodes_and_a_push_consumer_goes_on(
        module_cluster: Cluster, tmp_path: Path) -> None:
    """The leader is killed (the module's last test) under a Node.js PushConsumer given a
    follower's address. The NameServer lists the dead node for its lease (120 s), so the
    clients meet its address in their routes: the Python client's one channel to every node's
    address (its route names them together) moves past the dead one by itself; the Node.js
    client's retries stay on the
    entry chosen, so that send fails, the address is set aside and later sends go to the live
    nodes. The push consumer, which keeps the address of its first assignment (the follower it
    was given, not the leader's), receives what is sent after the kill."""
    rmq5_node_installed()
    ns, endpoints, group = module_cluster
    nodes, leader = _nodes(ns)
    access = nodes[next(n for n in sorted(nodes) if n != leader)]
    topic = "node-down"
    seen: set[str] = set()

    def has(bodies: set[str]) -> Any:
        def check(e: dict[str, Any]) -> bool:
            seen.add(e.get("body", ""))
            return bodies <= seen
        return check

    consumer = rmq5_node(tmp_path / "push", "push", access, topic, "node-down-g", "1000", "120")
    try:
        send_ours(ns, [Message(topic, b"before")])
        read_until(consumer, has({"before"}), 30)  # (its process queue exists: assigned)
        assert "before" in seen
        group.kill(leader, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _nodes(ns)[1] in (leader, None):
            assert time.monotonic() < deadline, "no new leader registered"
            time.sleep(0.1)  # (polling the NameServer: a condition with a deadline)
        assert leader in _nodes(ns)[0]  # still routed: the clients meet a dead address

        producer = rmq_producer(endpoints, [topic])
        try:  # (nine sends: each raises if all its attempts failed)
            via = set()
            for i in range(9):
                m = RmqMessage()
                m.topic, m.body = topic, b"py-%d" % i
                via.add(producer.send(m).message_queue.endpoints.facade)
        finally:
            producer.shutdown()
        assert via == {"ipv4:" + ",".join(sorted(nodes.values()))}  # the dead one's among them

        spec = [{"body": f"node-{i}"} for i in range(9)]
        events = finish(rmq5_node(tmp_path, "produce", access, topic, json.dumps(spec), "30"), 60)
        failed = [e for e in events if "error" in e]
        assert len([e for e in events if "msg_id" in e]) + len(failed) == 9, events
        assert len(failed) <= 1, failed  # at most the first send that met the dead node
        send_ours(ns, [Message(topic, b"ours-after")])

        sent = {f"py-{i}" for i in range(9)} | {"ours-after"} \
            | {f"node-{e['i']}" for e in events if "msg_id" in e}
        read_until(consumer, has(sent), 60)
        assert sent <= seen, f"the push consumer missed {sorted(sent - seen)}"
    finally:
        consumer.kill()
        consumer.wait(timeout=10)
