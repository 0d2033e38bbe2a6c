"""RocketMQ 5 clients against the brokers' gRPC endpoint (issue 20): the unmodified PyPI client
``rocketmq-python-client`` sends to a NameServer and a 3-node group (tests/frontends/conftest.py),
and our own client reads what it sent.

The RocketMQ client is synchronous (it runs its own threads and event loop); each test drives it
from the test's thread and our asyncio client with ``asyncio.run``."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import grpc
import pytest
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    MessageListener,
    PushConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq import Message as RmqMessage
from rocketmq import Producer as RmqProducer

from client import Message, Producer, ReceivedMessage
from dledger.client import LogClient
from protocol import broker_kinds as bp
from tests.frontends.grpc_helpers import (
    _leader_nodes,
    read_all,
    receive_by_group,
    receive_until,
    rmq_producer,
    send_delayed,
    send_ours,
    simple_consumer,
    started,
)

pytestmark = pytest.mark.slow


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
    send_ours(ns, [Message("shared", b"ours-%d" % i) for i in range(3)])
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


def test_our_producer_to_a_rocketmq_simple_consumer_with_acks_and_redelivery(
        cluster: tuple[str, str]) -> None:
    ns, endpoints = cluster

    send_ours(ns, [Message("simple", b"m%d" % i, tags="TagS", keys=[f"key-{i}"],
                           properties={"n": str(i)}) for i in range(4)])
    consumer = simple_consumer(endpoints, "simple-group", "simple")
    try:
        got = receive_until(consumer, 4, invisible_s=2)
        assert sorted(m.body for m in got) == [b"m%d" % i for i in range(4)]
        for m in got:  # body, tag, keys and properties intact the other way round
            i = int(m.body[1:])
            assert m.tag == "TagS" and m.keys == {f"key-{i}"} and m.properties["n"] == str(i)
            assert m.delivery_attempt == 1 and m.message_id
        unacked = next(m for m in got if m.body == b"m0")
        for m in got:
            if m is not unacked:
                consumer.ack(m)
        # the unacked one comes back after its invisible time, as a second delivery attempt
        again = receive_until(consumer, 1, invisible_s=2)
        assert [m.body for m in again] == [b"m0"] and again[0].delivery_attempt == 2
        with pytest.raises(Exception, match=r"stale|INVALID_RECEIPT"):
            consumer.ack(unacked)  # its first receipt stopped working when it came again
        consumer.ack(again[0])
        assert consumer.receive(16, 2) == []  # nothing more: acked messages never come again
    finally:
        consumer.shutdown()


def test_a_message_never_acked_goes_to_the_dead_letter_queue_after_max_attempts(
        cluster: tuple[str, str]) -> None:
    ns, endpoints = cluster
    producer = rmq_producer(endpoints, ["doomed"])
    try:
        m = RmqMessage()
        m.topic, m.body = "doomed", b"poison"
        sent = producer.send(m)
    finally:
        producer.shutdown()
    consumer = simple_consumer(endpoints, "doomed-group", "doomed")
    try:
        attempts = []
        deadline = time.monotonic() + 40
        while len(attempts) < 3:  # --grpc-max-delivery-attempts 3
            assert time.monotonic() < deadline
            attempts += [x.delivery_attempt for x in consumer.receive(16, 1)]
        assert attempts == [1, 2, 3]
        # after the third invisible time it is not delivered again: it is a dead letter
        assert consumer.receive(16, 1) == [] and consumer.receive(16, 1) == []
    finally:
        consumer.shutdown()
    dead = asyncio.run(read_all(ns, "%DLQ%doomed-group", 1))
    assert [d.body for d in dead] == [b"poison"] and dead[0].msg_id == sent.message_id


def test_fifo_messages_of_a_group_come_one_at_a_time_in_order(cluster: tuple[str, str]) -> None:
    _, endpoints = cluster
    producer = rmq_producer(endpoints, ["fifo"])
    try:
        for group in ("A", "B"):
            for i in range(3):
                m = RmqMessage()
                m.topic, m.body, m.message_group = "fifo", f"{group}{i}".encode(), group
                producer.send(m)
    finally:
        producer.shutdown()
    assert receive_by_group(endpoints, "fifo-group", "fifo", 6) \
        == {"A": ["A0", "A1", "A2"], "B": ["B0", "B1", "B2"]}


def test_our_ordered_sends_are_fifo_per_sharding_key_to_a_rocketmq_consumer(
        cluster: tuple[str, str]) -> None:
    ns, endpoints = cluster

    async def send() -> None:
        async with Producer(ns) as producer:
            for i in range(3):
                for key in ("A", "B"):
                    await producer.send_orderly(Message("ours-fifo", f"{key}{i}".encode()), key)
    asyncio.run(send())
    assert receive_by_group(endpoints, "ours-fifo-group", "ours-fifo", 6) \
        == {"A": ["A0", "A1", "A2"], "B": ["B0", "B1", "B2"]}


class Collect(MessageListener):  # type: ignore[misc]
    def __init__(self, name: str, into: dict[bytes, list[str]], lock: threading.Lock) -> None:
        self.name, self.into, self.lock = name, into, lock

    def consume(self, message: Any) -> ConsumeResult:
        with self.lock:
            self.into.setdefault(message.body, []).append(self.name)
        return ConsumeResult.SUCCESS


def test_two_push_consumers_of_a_group_share_a_topic(cluster: tuple[str, str]) -> None:
    ns, endpoints = cluster

    send_ours(ns, [Message("pushed", b"p%02d" % i) for i in range(40)])
    got: dict[bytes, list[str]] = {}
    lock = threading.Lock()
    consumers = []
    try:
        for name in ("c1", "c2"):
            consumers.append(started(lambda name=name: PushConsumer(
                ClientConfiguration(endpoints, Credentials()), "push-group",
                Collect(name, got, lock), {"pushed": FilterExpression()})))
        deadline = time.monotonic() + 30
        while len(got) < 40:
            assert time.monotonic() < deadline, f"consumed {len(got)} of 40"
            time.sleep(0.05)  # (the listeners run on the client's threads: poll with a deadline)
    finally:
        for c in consumers:
            c.shutdown()
    assert sorted(got) == [b"p%02d" % i for i in range(40)]
    assert all(len(names) == 1 for names in got.values()), "a message consumed twice"


class CommitOnCheck(TransactionChecker):  # type: ignore[misc]
    """Commits the transaction the test leaves open; the others are the test's own to end, so
    a check-back that comes first (the broker asks after 1 s: a slow machine may take longer to
    send the three) is answered UNSPECIFIED (Java's UNKNOWN) and leaves them open."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def check(self, message: Any) -> TransactionResolution:
        body = message.body.decode()
        self.asked.append(body)
        return (TransactionResolution.COMMIT if body == "checked"
                else TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED)


def test_transactions_commit_roll_back_and_resolve_by_check_back(
        cluster: tuple[str, str]) -> None:
    _, endpoints = cluster
    checker = CommitOnCheck()
    producer = started(lambda: RmqProducer(ClientConfiguration(endpoints, Credentials()), ["txn"],
                                           checker))
    consumer = simple_consumer(endpoints, "txn-group", "txn", await_s=1)
    try:
        txns = []
        for body in (b"committed", b"rolled-back", b"checked"):
            m = RmqMessage()
            m.topic, m.body = "txn", body
            t = producer.begin_transaction()
            producer.send(m, t)
            txns.append(t)
        # half messages are no consumer's: none shows but the one the check-back may have
        # committed already (the broker asks after 1 s: a slow machine sends the three later)
        early = consumer.receive(16, 5)
        assert all(m.body == b"checked" for m in early), [m.body for m in early]
        txns[0].commit()
        txns[1].rollback()
        # the third is left open: the leader asks a producer of the topic, which commits it
        got = early + receive_until(consumer, 2 - len(early), invisible_s=5, timeout_s=30)
        assert sorted(m.body for m in got) == [b"checked", b"committed"]
        assert "checked" in checker.asked
        for m in got:
            consumer.ack(m)
        assert consumer.receive(16, 5) == []  # the rolled-back one never shows
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_a_delay_message_is_not_received_before_its_time(cluster: tuple[str, str]) -> None:
    _, endpoints = cluster
    consumer = simple_consumer(endpoints, "delay-group", "later", await_s=1)
    producer = rmq_producer(endpoints, ["later"])
    try:
        due_ms = send_delayed(producer, "later", b"wait for it", 2500)
        got = receive_until(consumer, 1, invisible_s=10)
        assert time.time() * 1000 >= due_ms, "received before its delivery time"
        assert got[0].body == b"wait for it" and got[0].delivery_timestamp == due_ms
        consumer.ack(got[0])
    finally:
        producer.shutdown()
        consumer.shutdown()


def _stub(endpoints: str) -> Any:
    from rocketmq.grpc_protocol import service_pb2_grpc
    channel = grpc.insecure_channel(endpoints.split(";")[0])
    return channel, service_pb2_grpc.MessagingServiceStub(channel)


def test_calls_not_served_answer_not_implemented_and_errors_carry_the_protocols_codes(
        cluster: tuple[str, str]) -> None:
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as sv
    ns, endpoints = cluster
    channel, stub = _stub(endpoints)
    meta = [("x-mq-client-id", "raw-test")]
    try:
        assert stub.SyncLiteSubscription(sv.SyncLiteSubscriptionRequest(), timeout=5,
                                         metadata=meta).status.code == pb.Code.NOT_IMPLEMENTED
        # served since issue 35: an empty request is refused, naming what it lacks
        for call, request, code in (
                (stub.UpdateOffset, sv.UpdateOffsetRequest(), pb.Code.ILLEGAL_CONSUMER_GROUP),
                (stub.GetOffset, sv.GetOffsetRequest(), pb.Code.ILLEGAL_CONSUMER_GROUP),
                (stub.QueryOffset, sv.QueryOffsetRequest(), pb.Code.ILLEGAL_TOPIC),
                (stub.RecallMessage, sv.RecallMessageRequest(), pb.Code.ILLEGAL_TOPIC)):
            assert call(request, timeout=5, metadata=meta).status.code == code
        pulled = list(stub.PullMessage(sv.PullMessageRequest(), timeout=5, metadata=meta))
        assert [r.status.code for r in pulled] == [pb.Code.ILLEGAL_CONSUMER_GROUP]
        # the telemetry stream: settings answered with the server's, other commands refused
        settings = sv.TelemetryCommand()
        settings.settings.client_type = pb.ClientType.PRODUCER
        stray = sv.TelemetryCommand()
        stray.print_thread_stack_trace_command.nonce = "n1"
        stream = stub.Telemetry(iter([settings, stray]), timeout=5, metadata=meta)
        first, second = next(stream), next(stream)
        assert first.status.code == pb.Code.OK and first.settings.publishing.max_body_size > 0
        assert second.status.code == pb.Code.NOT_IMPLEMENTED
        stream.cancel()
        anonymous = stub.Telemetry(iter([settings]), timeout=5)  # no client id: refused, ended
        assert [c.status.code for c in anonymous] == [pb.Code.CLIENT_ID_REQUIRED]
        # an ack with a forged receipt acknowledges nothing
        forged = sv.AckMessageRequest(entries=[sv.AckMessageEntry(receipt_handle="a/0/0/999")])
        forged.group.name, forged.topic.name = "g", "codes"
        assert stub.AckMessage(forged, timeout=5, metadata=meta).status.code \
            == pb.Code.INVALID_RECEIPT_HANDLE
        forged.entries[0].receipt_handle = "not a handle"
        assert stub.AckMessage(forged, timeout=5, metadata=meta).status.code \
            == pb.Code.INVALID_RECEIPT_HANDLE

        def send(**fields: Any) -> Any:
            m = pb.Message(body=fields.pop("body", b"x"))
            m.topic.name = fields.pop("topic", "codes")
            m.system_properties.message_id = "01RAW"
            return stub.SendMessage(sv.SendMessageRequest(messages=[m]), timeout=5,
                                    metadata=meta).status.code
        assert send(body=b"x" * ((4 << 20) + 1)) == pb.Code.MESSAGE_BODY_TOO_LARGE
        assert send(body=b"") == pb.Code.MESSAGE_BODY_EMPTY
        assert send() == pb.Code.OK

        async def read_only() -> None:  # a topic nobody may write: FORBIDDEN, nothing stored
            async with LogClient(await _leader_nodes(ns), timeout_s=5) as client:
                await client.call_leader(bp.TOPIC_PUT, "closed", 4, 4, 4)
        asyncio.run(read_only())
        deadline = time.monotonic() + 20
        while send(topic="closed") != pb.Code.FORBIDDEN:  # (until the route shows the perm)
            assert time.monotonic() < deadline, "a write to a read-only topic was not refused"
            time.sleep(0.2)  # polling until the leader registers the new permission
        assert asyncio.run(read_all(ns, "closed", 0)) == []
    finally:
        channel.close()


