"""Message trace (issue 18's msgTrace): the record codec (round trips; garbage, mutations and
hostile JSON refused with TraceRecordError only), the trace message's keys, the formatter of a
message's life, the writer's bounded buffer (overflow dropped and counted, never raised) and
its listener wrapper; then on real processes a traced producer and four traced consumer groups
(push, push failing its first attempt so that the retry shows, lite pull, orderly) whose records
reach the trace topic and ``dledger message trace`` shows (the issue's item 5), and a full
buffer that costs the user's sends nothing."""

from __future__ import annotations

import asyncio
import datetime
import json
from collections import defaultdict
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cli import main as cli_main
from client import ConsumeStatus, Message, Producer, PullConsumer, PushConsumer, ReceivedMessage
from client.consumer.lite import LitePullConsumer
from client.consumer.orderly import OrderlyPushConsumer
from client.producer.producer import trace_producer
from client.trace.records import (
    CONSUME,
    SEND,
    TRACE_TOPIC,
    TraceRecord,
    TraceRecordError,
    decode_record,
    encode_record,
    format_life,
    trace_message,
)
from client.trace.tracer import Tracer
from client.types import MessageQueue
from dledger.client import LogClient
from dledger.localcluster import LocalCluster, free_ports
from protocol import broker_kinds as bp
from tests.broker.test_broker_processes import BROKER
from tests.broker.test_broker_requests import _leads, msg, refused
from tests.clusters import namesrv_group
from tests.nodes.test_processes import wait_until

FUZZ = settings(max_examples=300, deadline=timedelta(seconds=2))
UTC = datetime.UTC
TEXT = st.text(max_size=40)
INT = st.integers(-1, 2**63 - 1)
RECORDS = st.builds(
    TraceRecord, st.sampled_from([SEND, CONSUME]), INT, INT,
    st.sampled_from(["success", "later", "exception"]), TEXT, TEXT, TEXT, TEXT, INT, INT,
    st.lists(TEXT, max_size=5).map(tuple), TEXT, TEXT, TEXT, INT, TEXT)
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=16)


def rec(kind: str, time_ms: int, status: str, group: str = "", **kw: Any) -> TraceRecord:
    base: dict[str, Any] = dict(topic="orders", unique_key="U1", offset_msg_id="a-00000000000000A0-0",
                                broker_group="a", queue_id=2, queue_offset=7, tags="TagA",
                                keys=("order-1",), client_id="c1")
    base.update(kw)
    return TraceRecord(kind, time_ms, 3, status, group=group, **base)


# -- the codec --------------------------------------------------------------------------------------

@FUZZ
@given(RECORDS)
def test_every_record_round_trips(record: TraceRecord) -> None:
    assert decode_record(encode_record(record)) == record


@FUZZ
@given(st.binary(max_size=300))
def test_garbage_is_refused_with_a_named_error(body: bytes) -> None:
    with pytest.raises(TraceRecordError):
        decode_record(body)


@FUZZ
@given(RECORDS, st.data())
def test_a_mutated_record_decodes_to_a_record_or_is_refused(record: TraceRecord,
                                                           data: st.DataObject) -> None:
    body = bytearray(encode_record(record))
    for _ in range(data.draw(st.integers(1, 4))):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    try:
        assert isinstance(decode_record(bytes(body)), TraceRecord)
    except TraceRecordError:
        pass


@FUZZ
@given(RECORDS, st.sampled_from(["kind", "time_ms", "cost_ms", "status", "topic", "keys",
                                 "queue_id", "v", "reconsume_times"]), JSON)
def test_any_json_in_any_field_decodes_or_is_refused(record: TraceRecord, name: str,
                                                     value: Any) -> None:
    raw = json.loads(encode_record(record))
    raw[name] = value
    try:
        got = decode_record(json.dumps(raw).encode())
    except TraceRecordError:
        return
    assert getattr(got, name, None) in (value, tuple(value) if isinstance(value, list) else value) \
        or name == "v"


def test_hostile_bodies_are_refused() -> None:
    for body in (b"[" * 100_000, b"{}", b'{"v":1}', b'{"v":true,"kind":"send"}', b"null",
                 json.dumps({**json.loads(encode_record(rec(SEND, 1, "SEND_OK"))), "v": 2}).encode(),
                 b"x" * (1 << 17), "\u00e9".encode("latin-1")):
        with pytest.raises(TraceRecordError):
            decode_record(body)
    good = json.loads(encode_record(rec(CONSUME, 1, "success", "g")))
    for bad in ({"status": "maybe"}, {"kind": "peek"}, {"keys": "a b"}, {"keys": [1]},
                {"queue_id": -2}, {"time_ms": 1.5}, {"cost_ms": True}, {"topic": None}):
        with pytest.raises(TraceRecordError):
            decode_record(json.dumps({**good, **bad}).encode())
    assert decode_record(json.dumps({**good, "later_field": 1}).encode()).group == "g"
    with pytest.raises(TraceRecordError):
        decode_record("not bytes")  # type: ignore[arg-type]


def test_a_trace_message_is_keyed_by_the_unique_key_and_the_offset_msg_id() -> None:
    m = trace_message(rec(SEND, 1, "SEND_OK"))
    assert (m.topic, m.tags, m.keys) == (TRACE_TOPIC, SEND, ("U1", "a-00000000000000A0-0"))
    assert decode_record(m.body) == rec(SEND, 1, "SEND_OK")
    failed = TraceRecord(SEND, 1, 2, "SendTimeoutError", "orders")
    assert trace_message(failed).keys == ()


def test_the_life_shows_the_send_then_each_groups_attempts_in_time_order() -> None:
    records = [rec(CONSUME, 3000, "success", "g2", reconsume_times=1, queue_topic="%RETRY%g2",
                   client_id="c3"),
               rec(CONSUME, 1500, "success", "g1", client_id="c2"),
               rec(CONSUME, 1200, "later", "g2", client_id="c3"),
               rec(SEND, 1000, "SEND_OK", "pg", client_id="host@1")]
    text = format_life(records + records[:1], tz=UTC)  # a record read twice shows once
    lines = text.splitlines()
    assert lines[0] == ("message U1, offset msg id a-00000000000000A0-0, topic orders, "
                        "tags TagA, keys order-1")
    assert lines[1].startswith("  send     1970-01-01 00:00:01.000+00:00  SEND_OK")
    assert "orders a/2 offset 7" in lines[1] and "producer pg (client host@1)" in lines[1]
    assert lines[2] == "  consumer group g2: 2 attempt(s)"  # its first attempt came first
    assert "00:00:01.200" in lines[3] and "later" in lines[3] and "reconsume 0" in lines[3]
    assert "00:00:03.000" in lines[4] and "success" in lines[4] and "from %RETRY%g2" in lines[4]
    assert lines[5] == "  consumer group g1: 1 attempt(s)" and "client c2" in lines[6]
    assert len(lines) == 7
    assert "no send record" in format_life(records[:1], tz=UTC)
    assert "no consume record" in format_life(records[3:], tz=UTC)
    assert format_life([]) == "no trace records"


# -- the writer, without a cluster ---------------------------------------------------------------

def test_a_full_buffer_drops_and_counts_and_nothing_raises() -> None:
    async def run() -> Tracer:
        (port,) = free_ports(1)  # no NameServer there: every batch fails, counted
        tracer = Tracer([f"127.0.0.1:{port}"], "c1", trace_producer([f"127.0.0.1:{port}"]), buffer_max=5,
                        flush_s=0.05)
        for k in range(50):
            tracer.record(rec(SEND, k, "SEND_OK"))
        assert (len(tracer.pending()), tracer.dropped) == (5, 45)
        await wait_until(lambda: tracer.failed == 5, 10, "the batch to fail")
        tracer.record(rec(SEND, 99, "SEND_OK"))
        tracer.record(rec(SEND, 99, "SEND_OK", topic=TRACE_TOPIC))  # never a trace of a trace
        await tracer.close()
        tracer.record(rec(SEND, 100, "SEND_OK"))  # after close: ignored
        return tracer
    tracer = asyncio.run(run())
    assert (tracer.written, tracer.failed + tracer.dropped, tracer.pending()) == (0, 51, [])


def test_the_listener_wrapper_records_each_outcome_and_passes_it_on() -> None:
    def received(offset: int) -> ReceivedMessage:
        return ReceivedMessage(MessageQueue("orders", "a", 1), offset, b"x", "TagA", ("k",),
                               f"U{offset}", f"a-{offset:016X}-0", (), 1, 2, "orders")

    async def run() -> list[TraceRecord]:
        tracer = Tracer(["127.0.0.1:9"], "c1", trace_producer(["127.0.0.1:9"]), flush_s=60)

        def sync_listener(batch: list[ReceivedMessage]) -> ConsumeStatus | None:
            if batch[0].queue_offset == 2:
                raise RuntimeError("boom")
            return ConsumeStatus.SUCCESS if batch[0].queue_offset == 0 else None

        async def async_listener(batch: list[ReceivedMessage]) -> ConsumeStatus:
            if batch[0].queue_offset == 4:
                await asyncio.sleep(30)  # cancelled below, as the consume timeout does
            return ConsumeStatus.LATER

        wrapped = tracer.listener(sync_listener, "g")
        assert wrapped([received(0), received(1)]) is ConsumeStatus.SUCCESS
        assert wrapped([received(1)]) is None
        with pytest.raises(RuntimeError):
            wrapped([received(2)])
        awrapped = tracer.listener(async_listener, "g")
        assert await awrapped([received(3)]) is ConsumeStatus.LATER
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await awrapped([received(4)])
        pending = tracer.pending()
        tracer._closed = True  # (drop them: no NameServer to write to)
        return pending
    got = [(r.queue_offset, r.status, r.group, r.unique_key) for r in asyncio.run(run())]
    assert got == [(0, "success", "g", "U0"), (1, "success", "g", "U1"), (1, "later", "g", "U1"),
                   (2, "exception", "g", "U2"), (3, "later", "g", "U3"),
                   (4, "exception", "g", "U4")]


# -- live ------------------------------------------------------------------------------------------

LEVELS = "50ms 100ms 200ms 300ms 400ms " + " ".join(["500ms"] * 13)
FAST = dict(heartbeat_s=0.3, rebalance_s=0.5, commit_s=0.3, suspend_ms=300, start_from="first")


@pytest.fixture(scope="module")
def ns(tmp_path_factory: pytest.TempPathFactory):
    with namesrv_group(tmp_path_factory.mktemp("trace"), "--delay-levels", LEVELS,
                       size=1) as (addr, _):
        yield addr


async def trace_records(ns: str) -> list[TraceRecord]:
    """Every record in the trace topic (read straight from its queues)."""
    async with PullConsumer(ns, "trace-reader") as c:
        try:
            queues = await c.fetch_queues(TRACE_TOPIC, wait=False)
        except Exception:  # not created yet: no records
            return []
        out = []
        for mq in queues:
            offset = 0
            while True:
                res = await c.pull(mq, offset, 256)
                out += [decode_record(m.body) for m in res.messages]
                if not res.messages:
                    break
                offset = res.next_offset
        return out


@pytest.mark.slow
def test_send_and_each_groups_consumes_are_traced_with_the_retry(ns: str) -> None:
    async def run() -> None:
        attempts: dict[str, int] = defaultdict(int)

        def ok(batch: list[ReceivedMessage]) -> ConsumeStatus:
            return ConsumeStatus.SUCCESS

        def flaky(batch: list[ReceivedMessage]) -> ConsumeStatus:
            attempts[batch[0].msg_id] += 1
            return ConsumeStatus.SUCCESS if attempts[batch[0].msg_id] > 1 else ConsumeStatus.LATER

        async with Producer(ns, group="tpg", trace=True) as p:
            sent = [await p.send(Message("traced", b"m%d" % i, tags="TagT", keys=f"k{i}"))
                    for i in range(3)]
        assert p.tracer is not None and p.tracer.written == 3
        c1 = PushConsumer(ns, "tg1", ok, trace=True, **FAST)
        c2 = PushConsumer(ns, "tg2", flaky, trace=True, **FAST)
        lite = LitePullConsumer(ns, "tg3", start_from="first", trace=True)
        orderly = OrderlyPushConsumer(ns, "tg4", ok, trace=True, **FAST)
        for c in (c1, c2, lite, orderly):
            c.subscribe("traced")
        async with await c1.start(), await c2.start(), await lite.start(), await orderly.start():
            polled: list[ReceivedMessage] = []
            await wait_until(lambda: c1.consumed >= 3 and c2.consumed >= 3
                             and orderly.consumed >= 3, 30, "the push consumers")
            async def poll() -> bool:
                polled.extend(await lite.poll(0.2))
                return len(polled) >= 3
            await wait_until(poll, 30, "the lite consumer's polls")
        by_key: dict[str, list[TraceRecord]] = defaultdict(list)

        async def all_written() -> bool:
            by_key.clear()
            for r in await trace_records(ns):
                by_key[r.unique_key].append(r)
            return all(len(by_key[s.msg_id]) >= 6 for s in sent)
        await wait_until(all_written, 20, "every record in the trace topic")
        for s in sent:
            records = sorted(by_key[s.msg_id], key=lambda r: r.time_ms)
            (send,) = [r for r in records if r.kind == SEND]
            assert (send.status, send.offset_msg_id, send.topic, send.queue_offset) == \
                ("SEND_OK", s.offset_msg_id, "traced", s.queue_offset)
            assert send.keys == (f"k{sent.index(s)}",) and send.tags == "TagT"
            assert (send.group, send.client_id) == ("tpg", p.client_id)
            groups = defaultdict(list)
            for r in records:
                if r.kind == CONSUME:
                    groups[r.group].append((r.status, r.reconsume_times, r.client_id))
            assert groups["tg1"] == [("success", 0, c1.client_id)]
            assert groups["tg2"] == [("later", 0, c2.client_id), ("success", 1, c2.client_id)]
            assert groups["tg3"] == [("success", 0, lite.client_id)]
            assert groups["tg4"] == [("success", 0, orderly.client_id)]
            retry = next(r for r in records if r.group == "tg2" and r.reconsume_times == 1)
            assert retry.queue_topic == "%RETRY%tg2" and retry.topic == "traced"
            life = format_life(records)
            assert life.index("send ") < life.index("consumer group")
            assert "consumer group tg2: 2 attempt(s)" in life
        # the trace topic is a system topic: no record of a trace, no user may create it
        assert all(r.topic != TRACE_TOPIC for rs in by_key.values() for r in rs)
        # the item 5: dledger message trace ID shows the send and each group's consume,
        # found by the offset msg id or by the unique key
        s = sent[1]
        for message_id in (s.offset_msg_id, s.msg_id):
            got = await asyncio.to_thread(CliRunner().invoke, cli_main,
                                          ["message", "trace", message_id, "--namesrv", ns])
            assert got.exit_code == 0, got.output
            lines = got.output.splitlines()
            assert lines[0].startswith(f"message {s.msg_id}, offset msg id {s.offset_msg_id}, "
                                       f"topic traced, tags TagT, keys k1")
            assert lines[1].startswith("  send ") and "SEND_OK" in lines[1]
            assert f"by producer tpg (client {p.client_id})" in lines[1]
            assert f"traced a/{s.queue.queue_id} offset {s.queue_offset}" in lines[1]
            text = "\n".join(lines)
            for group, n in (("tg1", 1), ("tg2", 2), ("tg3", 1), ("tg4", 1)):
                assert f"consumer group {group}: {n} attempt(s)" in text, text
            tg2 = lines.index("  consumer group tg2: 2 attempt(s)")
            assert " later " in lines[tg2 + 1] and "reconsume 0" in lines[tg2 + 1]
            assert " success " in lines[tg2 + 2] and "from %RETRY%tg2" in lines[tg2 + 2]
        as_json = await asyncio.to_thread(CliRunner().invoke, cli_main,
                                          ["message", "trace", s.msg_id, "--json", "--namesrv", ns])
        assert sorted(r["group"] for r in json.loads(as_json.output) if r["kind"] == CONSUME) \
            == ["tg1", "tg2", "tg2", "tg3", "tg4"]
        none = await asyncio.to_thread(CliRunner().invoke, cli_main,
                                       ["message", "trace", "NOSUCHKEY", "--namesrv", ns])
        assert none.exit_code == 1 and "tracing is off by default" in none.output
    asyncio.run(run())


@pytest.mark.slow
def test_a_full_trace_buffer_costs_the_sends_nothing(ns: str) -> None:
    async def run() -> Producer:
        async with Producer(ns, trace=True) as p:
            assert p.tracer is not None
            p.tracer.buffer_max = 4
            results = await asyncio.gather(*(p.send(Message("flood", b"%d" % i))
                                             for i in range(40)))
            assert all(r.status == "SEND_OK" for r in results)
        return p
    p = asyncio.run(run())
    assert p.tracer is not None and p.tracer.dropped == 36 and p.tracer.written == 4


@pytest.mark.slow
def test_the_trace_topic_is_created_by_its_first_send_even_without_auto_create(
        tmp_path: Any) -> None:
    async def run(cluster: LocalCluster) -> None:
        async with LogClient(cluster.client_addresses, timeout_s=5.0) as client:
            await wait_until(lambda: _leads(client), 30, "the node to lead")
            await refused(client, "TOPIC_NOT_FOUND", bp.SEND, "user-topic", 0, [msg(b"x")])
            body = encode_record(rec(SEND, 1, "SEND_OK"))
            got = await client.call("n0", bp.SEND, TRACE_TOPIC, 0, [msg(body)])
            assert got[0] == "SEND_OK"
            topics = (await client.call("n0", bp.BROKER_STATUS))["topics"]
            assert TRACE_TOPIC in topics and "user-topic" not in topics
            await refused(client, "INVALID_TOPIC", bp.TOPIC_PUT, TRACE_TOPIC, 8, 8, 6)
    with LocalCluster(str(tmp_path), size=1, tick_ms=50,
                      program=(*BROKER, "--no-auto-create")) as cluster:
        asyncio.run(run(cluster))
