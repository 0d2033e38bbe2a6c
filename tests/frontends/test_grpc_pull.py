"""The 5.x pull consumer's calls (issue 35, item 3): PullMessage reads a queue from an offset with
the tag and SQL92 filters, QueryOffset answers a queue's beginning, end and offset by time,
UpdateOffset commits a consumer group's offset through the log (the same offset our own
consumers commit: it survives a leader change) and GetOffset answers it; bad input is refused
by name. The official Python client 5.1.2 has no pull consumer, so these call the protocol's
generated stubs directly (``tests.frontends.raw``), as a Java or Go PullConsumer would."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as sv

from dledger.client import LogClient
from protocol import broker_kinds as bp
from tests.frontends.raw import META, grpc_addresses, message, send, statuses, stub
from tests.frontends.test_grpc_forwarding import _nodes

pytestmark = pytest.mark.slow

TOPIC, GROUP = "pulled", "puller"


def _queue(s: Any, qid: int) -> Any:
    route = s.QueryRoute(sv.QueryRouteRequest(topic=pb.Resource(name=TOPIC)), timeout=10,
                         metadata=META)
    assert route.status.code == pb.Code.OK, route.status
    return next(q for q in route.message_queues if q.id == qid)


def pull(s: Any, mq: Any, offset: int, expression: str = "*", sql: bool = False,
         batch: int = 32, poll_s: int = 0) -> tuple[int, list[Any], int]:
    """(status code, messages, next offset) of one PullMessage (a refused one has no next
    offset: -1)."""
    r = sv.PullMessageRequest(offset=offset, batch_size=batch)
    r.group.name = GROUP
    r.message_queue.CopyFrom(mq)
    r.filter_expression.expression = expression
    r.filter_expression.type = pb.FilterType.SQL if sql else pb.FilterType.TAG
    r.long_polling_timeout.FromSeconds(poll_s)
    answers = list(s.PullMessage(r, timeout=poll_s + 10, metadata=META))
    codes = [a.status.code for a in answers if a.WhichOneof("content") == "status"]
    nexts = [a.next_offset for a in answers if a.WhichOneof("content") == "next_offset"]
    assert len(codes) == 1 and len(nexts) <= 1, answers
    return (codes[0], [a.message for a in answers if a.WhichOneof("content") == "message"],
            nexts[0] if nexts else -1)


def query(s: Any, mq: Any, policy: int, at_ms: int | None = None) -> Any:
    r = sv.QueryOffsetRequest(query_offset_policy=policy)
    r.message_queue.CopyFrom(mq)
    if at_ms is not None:
        r.timestamp.FromMilliseconds(at_ms)
    return s.QueryOffset(r, timeout=10, metadata=META)


def update(s: Any, mq: Any, offset: int, group: str = GROUP) -> Any:
    r = sv.UpdateOffsetRequest(offset=offset)
    r.group.name = group
    r.message_queue.CopyFrom(mq)
    return s.UpdateOffset(r, timeout=10, metadata=META)


def get(s: Any, mq: Any) -> Any:
    r = sv.GetOffsetRequest()
    r.group.name = GROUP
    r.message_queue.CopyFrom(mq)
    return s.GetOffset(r, timeout=10, metadata=META)


def test_a_pull_consumer_reads_a_queue_with_filters_and_keeps_its_offset_through_the_log(
        cluster: tuple[str, str]) -> None:
    ns, _ = cluster
    addresses = sorted(grpc_addresses(ns).values())
    with stub(addresses[0]) as s:
        sent = send(s, *[message(TOPIC, b"p%d" % i, f"P{i}", tag="AB"[i % 2],
                                 properties={"n": str(i)}) for i in range(6)])
        assert sent.status.code == pb.Code.OK, sent.status  # one batch: one queue, offsets 0..5
        assert [e.offset for e in sent.entries] == list(range(6))
        after_ms = int(time.time() * 1000) + 1000
        mq = _queue(s, _queue_of(s, "P0"))
        assert query(s, mq, pb.QueryOffsetPolicy.BEGINNING).offset == 0
        assert query(s, mq, pb.QueryOffsetPolicy.END).offset == 6
        assert query(s, mq, pb.QueryOffsetPolicy.TIMESTAMP, 0).offset == 0
        assert query(s, mq, pb.QueryOffsetPolicy.TIMESTAMP, after_ms).offset == 6

        code, got, nxt = pull(s, mq, 0)
        assert code == pb.Code.OK and nxt == 6
        assert [m.body for m in got] == [b"p%d" % i for i in range(6)]
        assert [m.system_properties.queue_offset for m in got] == list(range(6))
        assert got[3].system_properties.tag == "B" and got[3].user_properties["n"] == "3"
        assert got[0].system_properties.message_id == "P0"
        code, got, nxt = pull(s, mq, 2, batch=2)
        assert (code, [m.body for m in got], nxt) == (pb.Code.OK, [b"p2", b"p3"], 4)
        code, got, nxt = pull(s, mq, 0, "A")  # a tag filter, exactly
        assert (code, [m.body for m in got], nxt) == (pb.Code.OK, [b"p0", b"p2", b"p4"], 6)
        code, got, nxt = pull(s, mq, 0, "n > 3", sql=True)
        assert (code, [m.body for m in got], nxt) == (pb.Code.OK, [b"p4", b"p5"], 6)
        code, got, nxt = pull(s, mq, 6, poll_s=1)  # nothing new within its long poll
        assert (code, got, nxt) == (pb.Code.MESSAGE_NOT_FOUND, [], 6)
        code, got, nxt = pull(s, mq, 99)
        assert (code, got, nxt) == (pb.Code.ILLEGAL_OFFSET, [], 6)

        assert get(s, mq).status.code == pb.Code.OFFSET_NOT_FOUND
        assert update(s, mq, 4).status.code == pb.Code.OK
        # refused by name
        assert update(s, mq, -1).status.code == pb.Code.ILLEGAL_OFFSET
        assert update(s, mq, 4, group="").status.code == pb.Code.ILLEGAL_CONSUMER_GROUP
        elsewhere = pb.MessageQueue()
        elsewhere.CopyFrom(mq)
        elsewhere.topic.name = "no-such-topic"
        assert update(s, elsewhere, 1).status.code == pb.Code.TOPIC_NOT_FOUND
        elsewhere.CopyFrom(mq)
        elsewhere.id = 99
        assert pull(s, elsewhere, 0)[0] == pb.Code.BAD_REQUEST
        assert pull(s, mq, 0, batch=0)[0] == pb.Code.BAD_REQUEST
        assert query(s, mq, pb.QueryOffsetPolicy.TIMESTAMP).status.code == pb.Code.BAD_REQUEST
    for address in addresses:  # any node answers the committed offset (a follower forwards)
        with stub(address) as s:
            assert get(s, mq).offset == 4
    _transfer_leadership(ns)  # the offset is in the log: the new leader answers it too
    with stub(addresses[1]) as s:
        assert get(s, mq).offset == 4
        assert pull(s, mq, 4)[2] == 6


def _queue_of(s: Any, message_id: str) -> int:
    """The queue a sent message went to (a batch: one queue), read back by a pull of each."""
    for qid in range(8):
        try:
            mq = _queue(s, qid)
        except StopIteration:
            break
        _, got, _ = pull(s, mq, 0)
        if any(m.system_properties.message_id == message_id for m in got):
            return qid
    raise AssertionError(f"{message_id} is in no queue")


def _transfer_leadership(ns: str) -> None:
    st = statuses(ns)
    leader = next(nid for nid, x in st.items() if x["raft"]["role"] == "leader")
    other = next(nid for nid in st if nid != leader)

    async def move() -> None:
        nodes = {nid: client for nid, (client, _) in _nodes(ns).items()}
        async with LogClient(nodes, timeout_s=10) as client:
            await client.call(leader, bp.TRANSFER_LEADERSHIP, other)
    asyncio.run(move())
