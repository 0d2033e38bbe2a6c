"""RocketMQ 4.x applications, unmodified, against two broker groups: the C++ client (PyPI
``rocketmq-client-python``) and ali-ons (npm, JavaScript), each in its own environment
(``tests.remoting.clients``), given only the NameServer's address, send and consume through the
remoting endpoints (``--remoting-listen``). The notes' examples in 4.x form, each asserting what
arrived."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client import LitePullConsumer, Message, Producer, ReceivedMessage
from client.cluster import ask_consumer
from client.cluster.admin_views import consumer_views, summarize_consumers
from client.cluster.routes import Routes
from protocol.remoting import codes
from tests.clusters import namesrv_groups
from tests.frontends.grpc_helpers import started
from tests.nodes.test_processes import wait_until
from tests.remoting.clients import (
    ali,
    batch_python,
    cpp,
    cpp_log_lines,
    cpp_python,
    finish,
    read_until,
)
from tests.remoting.raw import RawRemoting

pytestmark = pytest.mark.xdist_group("remoting-4x")


async def _routed(ns: str, topic: str) -> None:
    """Until the NameServer routes ``topic`` to every group that stores some of it (a 4.x
    producer's first sends may create it on both groups, through TBW102)."""
    async def shown() -> bool:
        async with RawRemoting(ns) as c:
            answer = await c.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
            if answer.code != codes.SUCCESS:
                return False
            routed = {b["brokerName"] for b in json.loads(answer.body)["brokerDatas"]}
            groups = json.loads((await c.call(codes.GET_BROKER_CLUSTER_INFO)).body)
        for group, data in groups["brokerAddrTable"].items():
            leader = data["brokerAddrs"].get("0")
            if group in routed or leader is None:
                continue
            async with RawRemoting(leader) as b:
                for q in range(8):
                    top = await b.call(codes.GET_MAX_OFFSET, {"topic": topic, "queueId": str(q)})
                    if top.code == codes.SUCCESS and int(top.ext.get("offset", "0")) > 0:
                        return False  # stored there, not routed there yet
        return True
    await wait_until(shown, 30, f"the NameServer to route {topic} to every group holding it")


@pytest.fixture(scope="module")
def ns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cpp_python()  # (skipped before a cluster starts when the client is not there)
    base = tmp_path_factory.mktemp("cpp")
    with namesrv_groups(base, "--remoting-listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0",
                        "--transaction-timeout-s", "1",
                        "--transaction-check-interval-s", "1",
                        # (a check finds no producer until the C++ client's heartbeat reaches the
                        # leader, every 30 s; each counts, and the 15th would roll back: 15 s)
                        "--transaction-check-max", "200") as (address, _):
        yield address


def _produce(home: Path, ns: str, topic: str, *args: str, timeout_s: float = 60) -> list[dict]:
    """The C++ producer's events, every send acknowledged; the topic routed by the NameServer
    (a C++ consumer started before would wait for its next route refresh: 30 s)."""
    events = finish(cpp(home, "produce", "--namesrv", ns, "--topic", topic, *args), timeout_s)
    failed = [e for e in events if "error" in e]
    assert not failed, failed[:3]
    asyncio.run(_routed(ns, topic))
    return events


def test_sends_reach_a_new_consumer_group_with_tags_keys_and_properties(ns: str,
                                                                          tmp_path: Path) -> None:
    sent = _produce(tmp_path, ns, "cpp-plain", "--count", "100", "--tags", "TagA")
    assert len(sent) == 100 and all(e["status"] == 0 for e in sent)
    got = finish(cpp(tmp_path, "consume", "--namesrv", ns, "--topic", "cpp-plain", "--group",
                     "cpp-new-group", "--expect", "100", "--timeout-s", "90"), 120)
    messages = [e for e in got if "body" in e]
    bodies = sorted(int(m["body"].split()[-1]) for m in messages)
    assert bodies == list(range(100)), f"{len(bodies)} received"  # each once
    for m in messages:
        i = int(m["body"].split()[-1])
        assert m["tags"] == "TagA" and m["keys"] == f"key-{i}"
        assert m["props"]["color"] == ("red" if i % 2 else "blue")
        assert m["id"] == m["props"]["UNIQ_KEY"] == sent[i]["msg_id"]


def test_two_producers_started_together_lose_nothing_to_shared_message_ids(
        ns: str, tmp_path: Path) -> None:
    """The C++ client gives processes started in the same second some of the same message ids;
    the broker stores each message (a retry is the same id and content, not the same id)."""
    procs = [cpp(tmp_path / name, "produce", "--namesrv", ns, "--topic", "cpp-twins", "--count",
                 "150", "--body-prefix", f"{name} ", "--group", "cpp-twins-p")
             for name in ("p1", "p2")]
    sent = [finish(p, 90) for p in procs]
    assert all(len(events) == 150 and all("error" not in e for e in events) for events in sent)
    shared = {e["msg_id"] for e in sent[0]} & {e["msg_id"] for e in sent[1]}
    asyncio.run(_routed(ns, "cpp-twins"))
    got = finish(cpp(tmp_path, "consume", "--namesrv", ns, "--topic", "cpp-twins", "--group",
                     "cpp-twins-g", "--expect", "300", "--timeout-s", "90"), 120)
    bodies = sorted(e["body"] for e in got if "body" in e)
    expected = sorted(f"{name} {i}" for name in ("p1", "p2") for i in range(150))
    by_queue: dict[int, int] = {}  # (queue ids of both groups together)
    for e in got:
        if "body" in e:
            by_queue[e["queue"]] = by_queue.get(e["queue"], 0) + 1
    assert bodies == expected, (
        f"{len(bodies)} of 300 received; {len(shared)} ids shared; by queue id {by_queue}; "
        f"the consumer's log: {cpp_log_lines(tmp_path, 'lastoffset', 'timed_mutex', 'null')}")


def test_a_running_cpp_consumer_answers_for_itself(ns: str, tmp_path: Path) -> None:
    """GET_CONSUMER_RUNNING_INFO (307) reaches a C++ push consumer on its connection, through
    ``dledger consumer running-info``'s library call; it answers with its subscriptions."""
    _produce(tmp_path, ns, "cpp-info", "--count", "1")
    proc = cpp(tmp_path, "consume", "--namesrv", ns, "--topic", "cpp-info", "--group",
               "cpp-info-g", "--expect", "1000000", "--timeout-s", "60")

    async def run() -> dict[str, Any]:
        routes = Routes(ns)
        await routes.start()
        try:
            async def member() -> bool:
                views = [v for g in await routes.cluster_groups()
                         for v in await consumer_views(routes, g, "cpp-info-g")]
                ids[:] = [m["client_id"] for m in summarize_consumers("cpp-info-g",
                                                                       views)["members"]]
                return bool(ids)
            ids: list[str] = []
            await wait_until(member, 30, "the C++ consumer's heartbeat")
            return await ask_consumer.running_info(routes, "cpp-info-g", ids[0])
        finally:
            await routes.close()
    try:
        read_until(proc, lambda e: "started" in e, 30)
        info = asyncio.run(run())
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert {"cpp-info", "%RETRY%cpp-info-g"} <= {s["topic"] for s in info["subscriptionSet"]}
    assert sorted(q["key"]["queueId"] for q in info["mqTable"]) == [0, 1, 2, 3]  # (read from
    assert info["properties"]["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"  # object-keyed JSON)


def test_a_batch_send_arrives_whole(ns: str, tmp_path: Path) -> None:
    """PyPI rocketmq 0.4.4 (the same C++ family) sends 10 messages in one SEND_BATCH_MESSAGE;
    a consumer of a new group receives each, with its tag, key and property."""
    sent = finish(cpp(tmp_path, "produce", "--namesrv", ns, "--topic", "cpp-batch", "--count",
                      "10", "--mode", "batch", "--tags", "TagB", python=batch_python()), 60)
    assert [e.get("batch") for e in sent] == [10] and sent[0]["status"] == 0, sent
    asyncio.run(_routed(ns, "cpp-batch"))
    got = finish(cpp(tmp_path, "consume", "--namesrv", ns, "--topic", "cpp-batch", "--group",
                     "cpp-batch-g", "--expect", "10", "--timeout-s", "60"), 90)
    messages = [e for e in got if "body" in e]
    assert sorted(int(m["body"].split()[-1]) for m in messages) == list(range(10))
    for m in messages:
        i = int(m["body"].split()[-1])
        assert m["tags"] == "TagB" and m["keys"] == f"key-{i}"
        assert m["props"]["color"] == ("red" if i % 2 else "blue")


def test_oneway_sends_arrive(ns: str, tmp_path: Path) -> None:
    """The producer stays up until the consumer has its messages (a oneway send returns before
    its bytes leave, and a shutdown closes the connections under writes still queued)."""
    producer = cpp(tmp_path, "produce", "--namesrv", ns, "--topic", "cpp-oneway", "--count", "20",
                   "--mode", "oneway", "--hold-s", "150", stdin=True)
    try:
        sent = read_until(producer, lambda e: "holding" in e, 60)
        assert [e for e in sent if "error" in e] == [] and "holding" in sent[-1], sent[-3:]
        asyncio.run(_routed(ns, "cpp-oneway"))
        got = finish(cpp(tmp_path, "consume", "--namesrv", ns, "--topic", "cpp-oneway",
                         "--group", "cpp-oneway-g", "--expect", "20", "--timeout-s", "60"), 90)
    finally:
        finish(producer, 30)  # (closes its stdin: its hold ends, it shuts down)
    arrived = sorted(int(e["body"].split()[-1]) for e in got if "body" in e)
    assert arrived == list(range(20)), cpp_log_lines(tmp_path, "error", "warn", "fail", "timeout")


def test_an_orderly_producer_and_consumer_keep_each_queues_order(ns: str,
                                                                  tmp_path: Path) -> None:
    sent = _produce(tmp_path, ns, "cpp-orderly", "--count", "60", "--mode", "orderly",
                    "--shards", "4")
    assert len(sent) == 60
    got = finish(cpp(tmp_path, "consume", "--namesrv", ns, "--topic", "cpp-orderly", "--group",
                     "cpp-orderly-g", "--orderly", "--expect", "60", "--timeout-s", "90"), 120)
    messages = [e for e in got if "body" in e]
    assert len({m["body"] for m in messages}) == 60
    by_shard: dict[int, list[int]] = {}
    for m in messages:  # (a shard's messages share one queue: the selector hashes the key)
        i = int(m["body"].split()[-1])
        by_shard.setdefault(i % 4, []).append(i)
    for shard, seq in by_shard.items():
        first = [i for k, i in enumerate(seq) if i not in seq[:k]]
        assert first == sorted(first), f"shard {shard} out of order: {first}"


def test_broadcasting_consumers_each_get_every_message_of_their_tag(ns: str,
                                                                     tmp_path: Path) -> None:
    """Two members of one group in BROADCASTING mode, subscribed to TagA: each receives every
    TagA message, neither a TagB one. (A broadcasting consumer starts at the queues' end, so the
    messages counted are sent once both have received a warm-up message.)"""
    _produce(tmp_path, ns, "cpp-bcast", "--count", "1", "--tags", "TagA", "--body-prefix", "w ")
    members = [cpp(tmp_path / m, "consume", "--namesrv", ns, "--topic", "cpp-bcast", "--group",
                   "cpp-bcast-g", "--broadcast", "--expression", "TagA", "--instance", m,
                   "--expect", "1000000", "--timeout-s", "120") for m in ("m1", "m2")]
    seen: list[list[dict[str, Any]]] = [[], []]
    try:
        for k, proc in enumerate(members):
            seen[k] += read_until(proc, lambda e: "started" in e, 30)
        for attempt in range(30):  # warm-up sends until both members consume (bounded)
            _produce(tmp_path, ns, "cpp-bcast", "--count", "1", "--tags", "TagA",
                     "--body-prefix", f"w{attempt} ")
            for k, proc in enumerate(members):
                if not any(e.get("body", "").startswith("w") for e in seen[k]):
                    seen[k] += read_until(proc, lambda e: e.get("body", "").startswith("w"), 2)
            if all(any(e.get("body", "").startswith("w") for e in got) for got in seen):
                break
        else:
            raise AssertionError("the broadcasting members never began to consume")
        _produce(tmp_path, ns, "cpp-bcast", "--count", "10", "--tags", "TagA",
                 "--body-prefix", "a ")
        _produce(tmp_path, ns, "cpp-bcast", "--count", "10", "--tags", "TagB",
                 "--body-prefix", "b ")
        want = {f"a {i}" for i in range(10)}
        for k, proc in enumerate(members):
            have = {e.get("body") for e in seen[k]}

            def complete(e: dict[str, Any], have: set[Any] = have) -> bool:
                have.add(e.get("body"))
                return want <= have
            if not want <= have:
                seen[k] += read_until(proc, complete, 60)
    finally:
        for proc in members:
            proc.kill()
            proc.wait(timeout=10)
    for got in seen:
        bodies = [e["body"] for e in got if "body" in e]
        assert {f"a {i}" for i in range(10)} <= set(bodies), bodies
        assert all(e["tags"] == "TagA" for e in got if "body" in e), bodies


def test_delay_level_3_arrives_ten_seconds_later(ns: str, tmp_path: Path) -> None:
    _produce(tmp_path, ns, "cpp-delay", "--count", "1", "--body-prefix", "first")
    consumer = cpp(tmp_path, "consume", "--namesrv", ns, "--topic", "cpp-delay", "--group",
                   "cpp-delay-g", "--expect", "2", "--timeout-s", "90")
    try:
        assert read_until(consumer, lambda e: "body" in e, 60), "the consumer received nothing"
        sent = _produce(tmp_path, ns, "cpp-delay", "--count", "1", "--delay-level", "3",
                        "--body-prefix", "later")
        got = read_until(consumer, lambda e: e.get("body", "").startswith("later"), 40)
    finally:
        consumer.kill()
        consumer.wait(10)
    later = [e for e in got if e.get("body", "").startswith("later")]
    assert later, "the delayed message did not arrive"
    waited_s = (later[0]["recv_ms"] - sent[0]["sent_ms"]) / 1000
    assert 9.0 <= waited_s <= 11.0, waited_s  # level 3 is 10 s (the bound is the issue's)


def test_a_failed_message_comes_back_from_the_retry_topic(ns: str, tmp_path: Path) -> None:
    _produce(tmp_path, ns, "cpp-retry", "--count", "1")
    got = finish(cpp(tmp_path, "consume", "--namesrv", ns, "--topic", "cpp-retry", "--group",
                     "cpp-retry-g", "--fail-first", "1", "--expect", "1", "--timeout-s", "90"),
                 120)
    messages = [e for e in got if "body" in e]
    assert messages[0]["failed"] and messages[0]["reconsume"] == 0
    again = [m for m in messages if not m["failed"]]
    assert again and again[0]["reconsume"] == 1 and again[0]["body"] == messages[0]["body"]
    assert again[0]["props"]["RETRY_TOPIC"] == "cpp-retry"
    assert again[0]["topic"] == "cpp-retry"  # (the client shows the original topic)


def _cpp_reads(home: Path, ns: str, topic: str, body: str, tags: str, key: str,
               color: str) -> None:
    """The C++ client (a new group) reads five messages ``<body> i`` of ``topic``, each with its
    tag, key ``<key>i`` and property ``color`` intact."""
    asyncio.run(_routed(ns, topic))  # (else the client waits for its next route refresh: 30 s)
    got = finish(cpp(home, "consume", "--namesrv", ns, "--topic", topic, "--group",
                     f"cpp-from-{topic}", "--expect", "5", "--timeout-s", "60"), 90)
    messages = [e for e in got if "body" in e]
    assert sorted(m["body"] for m in messages) == [f"{body} {i}" for i in range(5)]
    for m in messages:
        i = int(m["body"].split()[-1])
        assert m["tags"] == tags and m["keys"] == f"{key}{i}" and m["props"]["color"] == color


def test_messages_cross_between_a_4x_client_and_ours(ns: str, tmp_path: Path) -> None:
    _produce(tmp_path, ns, "cpp-to-ours", "--count", "5", "--tags", "TagX")

    async def ours() -> None:
        lite = LitePullConsumer(ns, "ours-g", start_from="first")
        lite.subscribe("cpp-to-ours")
        seen: list[ReceivedMessage] = []
        async with await lite.start():
            async def five() -> bool:
                seen.extend(await lite.poll(0.2))
                return len(seen) >= 5
            await wait_until(five, 30, "our consumer to receive the 4.x client's messages")
        assert sorted(m.body for m in seen) == [f"hello {i}".encode() for i in range(5)]
        for m in seen:
            i = int(m.body.split()[-1])
            assert m.tags == "TagX" and list(m.keys) == [f"key-{i}"]
            assert dict(m.properties)["color"] == ("red" if i % 2 else "blue")
        async with Producer(ns) as p:
            for i in range(5):
                await p.send(Message("ours-to-cpp", f"ours {i}".encode(), tags="TagY",
                                     keys=[f"ok-{i}"], properties={"color": "green"}))
    asyncio.run(ours())
    _cpp_reads(tmp_path, ns, "ours-to-cpp", "ours", "TagY", "ok-", "green")


def test_a_transaction_producer_commits_rolls_back_and_answers_the_check_back(
        ns: str, tmp_path: Path) -> None:
    """Message i's local transaction commits (i % 3 == 0), rolls back (1) or is not known yet
    (2): the leader's check-back asks the producer, which commits. Consumers see 0, 2, 3, 5."""
    events = finish(cpp(tmp_path, "transact", "--namesrv", ns, "--topic", "cpp-txn", "--group",
                        "cpp-txn-producer", "--count", "6", "--linger-s", "75",
                        "--until-checked", "key-2,key-5"), 120)
    sent = [e for e in events if "i" in e]
    assert [e.get("error") for e in sent] == [None] * 6 and len(sent) == 6
    checked = {e["checked"] for e in events if "checked" in e}
    assert {"key-2", "key-5"} <= checked, (events, cpp_log_lines(  # (others may be asked too)
        tmp_path, "heartbeat", "checktransaction", "error", "route"))
    asyncio.run(_routed(ns, "cpp-txn"))
    got = finish(cpp(tmp_path, "consume", "--namesrv", ns, "--topic", "cpp-txn", "--group",
                     "cpp-txn-g", "--expect", "4", "--timeout-s", "60"), 90)
    bodies = sorted(e["body"] for e in got if "body" in e)
    assert bodies == ["hello 0", "hello 2", "hello 3", "hello 5"]


def test_ali_ons_consumes_with_sql92_and_a_failing_message_goes_to_retry_then_dlq(
        ns: str, tmp_path: Path) -> None:
    """ali-ons sends ten messages with the user property a = i; a consumer subscribed with
    ``a >= 5`` gets 5..9; the one it always fails (``ali 7``) comes back from ``%RETRY%`` once
    (its maximum reconsume times: 1) and then lands in ``%DLQ%<group>``. ali-ons sends only to
    a topic that exists (it does not ask for TBW102): the operator creates it first."""
    subprocess.run([sys.executable, "-c", "import cli; cli.main()", "topic", "create", "ali-sql",
                    "--queues", "4", "--namesrv", ns], check=True, capture_output=True, timeout=60)
    asyncio.run(_routed(ns, "ali-sql"))
    sent = finish(ali(tmp_path, "produce", ns, "ali-sql", "10"), 60)
    assert [e.get("error") for e in sent] == [None] * 10, sent
    async def dead_letter() -> list[ReceivedMessage]:
        lite = LitePullConsumer(ns, "dlq-reader", start_from="first")
        lite.subscribe("%DLQ%ali-sql-g")
        seen: list[ReceivedMessage] = []
        async with await lite.start():
            async def arrived() -> bool:
                seen.extend(await lite.poll(0.2))
                return bool(seen)
            await wait_until(arrived, 60, "the failing message in the dead-letter queue")
        return seen

    consumer = ali(tmp_path, "consume", ns, "ali-sql", "ali-sql-g", "a >= 5", "4", "150",
                   "ali 7", "1")
    failures = [0]

    def second_failure(e: dict[str, Any]) -> bool:
        failures[0] += bool(e.get("failed"))
        return failures[0] >= 2  # the first delivery and its one retry

    try:
        got = read_until(consumer, second_failure, 110)
        dead = asyncio.run(dead_letter())  # (the consumer sends it back: it still runs)
    finally:
        consumer.kill()
        consumer.wait(10)
    delivered = [e for e in got if "body" in e]
    assert sorted({e["body"] for e in delivered}) == [f"ali {i}" for i in range(5, 10)]
    assert all(int(e["a"]) >= 5 for e in delivered)
    failing = [e for e in delivered if e["failed"]]
    assert [e["reconsume"] for e in failing] == [0, 1], failing
    assert [m.body for m in dead] == [b"ali 7"]


def test_messages_cross_between_a_4x_client_and_a_rocketmq_5_client(ns: str,
                                                                    tmp_path: Path) -> None:
    """The C++ client's messages reach the RocketMQ 5 client (gRPC) with body, tag, keys and
    properties, and the RocketMQ 5 client's reach the C++ client the same way."""
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer
    from rocketmq import Message as RmqMessage
    from rocketmq import Producer as RmqProducer

    from tests.frontends.endpoints import grpc_endpoints
    endpoints = grpc_endpoints(ns)
    _produce(tmp_path, ns, "cpp-to-rmq5", "--count", "5", "--tags", "TagX")
    consumer = started(lambda: SimpleConsumer(ClientConfiguration(endpoints, Credentials()),
                                              "rmq5-from-cpp", {"cpp-to-rmq5": FilterExpression()},
                                              await_duration=1))
    try:
        got: list[Any] = []
        for _ in range(60):  # (each receive long-polls 1 s: bounded by the count)
            got += consumer.receive(16, 30)
            if len(got) >= 5:
                break
        for m in got:
            consumer.ack(m)
    finally:
        consumer.shutdown()
    assert sorted(m.body for m in got) == [f"hello {i}".encode() for i in range(5)]
    for m in got:
        i = int(m.body.split()[-1])
        assert m.tag == "TagX" and m.keys == {f"key-{i}"}
        assert m.properties["color"] == ("red" if i % 2 else "blue")
    producer = started(lambda: RmqProducer(ClientConfiguration(endpoints, Credentials()),
                                           ["rmq5-to-cpp"]))
    try:
        for i in range(5):
            m = RmqMessage()
            m.topic, m.body, m.tag = "rmq5-to-cpp", f"rmq5 {i}".encode(), "TagZ"
            m.keys = f"r-{i}"
            m.add_property("color", "violet")
            producer.send(m)
    finally:
        producer.shutdown()
    _cpp_reads(tmp_path, ns, "rmq5-to-cpp", "rmq5", "TagZ", "r-", "violet")
