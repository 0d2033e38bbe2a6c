"""The pull consumer's calls of the gRPC endpoint (``broker.frontends.grpc.gateway``): PullMessage,
UpdateOffset, GetOffset and QueryOffset (RocketMQ 5.x's PullConsumer: the client chooses the
queues, from QueryRoute, and keeps its own position), each a request of the broker's kinds to
the group the message queue names (``_leader_call``: this node's own group through the broker
API, another group through our client library).

- PullMessage reads one queue from an offset as our own pull does (PULL, or PULL_SQL for an SQL92
  filter; at the leader, as our client's pulls: a follower might not have applied yet what the
  client was told was stored; long polling up to the request's timeout). A tag filter is
  checked exactly here (the broker filters by the tag's hash, and a RocketMQ 5 client does not
  check again). The answer is a status (OK, MESSAGE_NOT_FOUND, or
  ILLEGAL_OFFSET for an offset outside the queue), the messages, then the next offset to pull
  from (past the filtered ones; for an illegal offset, the queue's nearest end).
- UpdateOffset commits a consumer group's offset on a queue through the log (OFFSET_COMMIT, as
  our consumers' commits); GetOffset answers it (OFFSET_QUERY, at the leader), OFFSET_NOT_FOUND
  if the group never committed there.
- QueryOffset answers a queue's first retained offset (BEGINNING), its max offset (END), or the
  first offset stored at or after a time (TIMESTAMP, SEARCH_OFFSET).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as sv

from broker.frontends.grpc.codec import GatewayError, guarded, outbound, status
from broker.frontends.grpc.consume import DEADLINE_MARGIN_S, POLL_MS_MAX, duration_ms, filter_of
from broker.frontends.grpc.owngroup import OwnGroup
from protocol import broker_kinds as bp
from protocol.topics import MAX_QUEUES

__all__ = ["PULL_BYTES_MAX", "PullCalls"]

PULL_BYTES_MAX = 15 << 20  # a pull's answer, under the gRPC message limit (16 MiB)
QUERY_TIMEOUT_S = 5.0


def _queue(mq: Any) -> tuple[str, str, int]:
    """(topic, group, queue id) of a request's message queue, each checked."""
    topic, group, qid = mq.topic.name, mq.broker.name, mq.id
    if not topic:
        raise GatewayError(pb.Code.ILLEGAL_TOPIC, "the message queue names no topic")
    if not group:
        raise GatewayError(pb.Code.BAD_REQUEST, "the message queue names no broker (its group)")
    if not 0 <= qid < MAX_QUEUES:
        raise GatewayError(pb.Code.BAD_REQUEST, f"queue id {qid} is not 0..{MAX_QUEUES - 1}")
    return topic, group, qid


def _consumer_group(request: Any) -> str:
    if not request.group.name:
        raise GatewayError(pb.Code.ILLEGAL_CONSUMER_GROUP, "the request names no group")
    return str(request.group.name)


def _offset(value: int) -> int:
    if value < 0:
        raise GatewayError(pb.Code.ILLEGAL_OFFSET, f"an offset is at least 0, not {value}")
    return value


def _pull_refused(status: Any) -> list[Any]:  # (``guarded`` calls it with a status)
    return [sv.PullMessageResponse(status=status)]


class PullCalls:
    """The pull consumer's RPCs, mixed into ``GrpcGateway`` (which provides these)."""

    calls: int
    own: OwnGroup

    if TYPE_CHECKING:  # (``ConsumeCalls``')
        async def _leader_call(self, topic: str, group: str, kind: int, *args: Any,
                               timeout_s: float = 5.0) -> Any: ...

    async def _read(self, topic: str, group: str, kind: int, *args: Any,
                    timeout_s: float = QUERY_TIMEOUT_S) -> Any:
        """A read at the group's leader (a follower could serve it, but might not have applied
        yet what the client was just told was stored)."""
        if group == self.own.group:
            return await self.own.call(kind, *args, timeout_s=timeout_s, at_leader=True)
        return await self._leader_call(topic, group, kind, *args, timeout_s=timeout_s)

    async def PullMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self.calls += 1
        for answer in await self._pulled(request, context):
            yield answer

    @guarded(_pull_refused)
    async def _pulled(self, request: Any, context: Any) -> list[Any]:
        """PullMessage's answers: a status, the messages, the next offset (a refusal: its
        status alone)."""
        try:
            _consumer_group(request)
            topic, group, qid = _queue(request.message_queue)
            start = _offset(request.offset)
            if not 0 < request.batch_size <= bp.MAX_PULL_MESSAGES:
                raise GatewayError(pb.Code.BAD_REQUEST,
                                   f"batch size must be 1..{bp.MAX_PULL_MESSAGES}")
            tags, sql = filter_of(request.filter_expression)
            suspend_ms = min(duration_ms(request.long_polling_timeout), POLL_MS_MAX, bp.MAX_SUSPEND_MS)
            remaining = context.time_remaining()
            if remaining is not None:
                suspend_ms = max(0, min(suspend_ms, int((remaining - DEADLINE_MARGIN_S) * 1000)))
            kind, last = (bp.PULL_SQL, sql) if sql else (bp.PULL, tags)
            found, next_offset, lo, hi, rows = await self._read(
                topic, group, kind, topic, qid, start, request.batch_size, PULL_BYTES_MAX,
                suspend_ms, last, timeout_s=suspend_ms / 1000 + QUERY_TIMEOUT_S)
        except GatewayError as err:
            return _pull_refused(status(err.code, str(err)))
        if found == bp.OFFSET_OUT_OF_RANGE:
            return [sv.PullMessageResponse(status=status(
                        pb.Code.ILLEGAL_OFFSET, f"offset {start} is outside queue {qid} of {topic} "
                                                f"({lo}..{hi})")),
                    sv.PullMessageResponse(next_offset=lo if start < lo else hi)]
        if "*" not in tags:  # exactly (the broker compared the tags' hashes)
            wanted = set(tags)
            rows = [r for r in rows if r[2] in wanted]
        out = [sv.PullMessageResponse(status=status() if rows else status(
            pb.Code.MESSAGE_NOT_FOUND, "no new message"))]
        out += [sv.PullMessageResponse(message=outbound(
                    topic, qid, off, body, tags_, tuple(keys), key, tuple(map(tuple, props)),
                    born, store)) for off, body, tags_, keys, key, props, born, store, _ in rows]
        out.append(sv.PullMessageResponse(next_offset=next_offset))
        return out

    async def _group_call(self, request: Any, kind: int, *args: Any) -> Any:
        """A consumer group's request on the queue a request names, at its group's leader:
        ``kind`` with (consumer group, topic, queue id, *args)."""
        consumer = _consumer_group(request)
        topic, group, qid = _queue(request.message_queue)
        return await self._leader_call(topic, group, kind, consumer, topic, qid, *args,
                                       timeout_s=QUERY_TIMEOUT_S)

    @guarded(sv.UpdateOffsetResponse)
    async def UpdateOffset(self, request: Any, context: Any) -> Any:
        self.calls += 1
        try:
            await self._group_call(request, bp.OFFSET_COMMIT, _offset(request.offset))
        except GatewayError as err:
            return sv.UpdateOffsetResponse(status=status(err.code, str(err)))
        return sv.UpdateOffsetResponse(status=status())

    @guarded(sv.GetOffsetResponse)
    async def GetOffset(self, request: Any, context: Any) -> Any:
        self.calls += 1
        try:
            committed = await self._group_call(request, bp.OFFSET_QUERY)
            if committed < 0:
                raise GatewayError(pb.Code.OFFSET_NOT_FOUND,
                                   f"group {request.group.name!r} committed no offset on queue "
                                   f"{request.message_queue.id} of {request.message_queue.topic.name}")
        except GatewayError as err:
            return sv.GetOffsetResponse(status=status(err.code, str(err)))
        return sv.GetOffsetResponse(status=status(), offset=committed)

    @guarded(sv.QueryOffsetResponse)
    async def QueryOffset(self, request: Any, context: Any) -> Any:
        self.calls += 1
        try:
            topic, group, qid = _queue(request.message_queue)
            policy = request.query_offset_policy
            if policy == pb.QueryOffsetPolicy.TIMESTAMP:
                if not request.HasField("timestamp"):
                    raise GatewayError(pb.Code.BAD_REQUEST, "a TIMESTAMP query names a time")
                ts = request.timestamp
                offset = await self._read(
                    topic, group, bp.SEARCH_OFFSET, topic, qid,
                    max(0, ts.seconds * 1000 + ts.nanos // 1_000_000))
            elif policy in (pb.QueryOffsetPolicy.BEGINNING, pb.QueryOffsetPolicy.END):
                _, _, lo, hi, _ = await self._read(  # (no message: the offsets only)
                    topic, group, bp.PULL, topic, qid, 0, 0, 0, 0, ["*"])
                offset = lo if policy == pb.QueryOffsetPolicy.BEGINNING else hi
            else:
                raise GatewayError(pb.Code.BAD_REQUEST, f"unknown query offset policy {policy}")
        except GatewayError as err:
            return sv.QueryOffsetResponse(status=status(err.code, str(err)))
        return sv.QueryOffsetResponse(status=status(), offset=offset)
