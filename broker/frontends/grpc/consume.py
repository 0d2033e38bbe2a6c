"""The consuming calls of the gRPC endpoint (``broker.frontends.grpc.gateway``): QueryAssignment,
ReceiveMessage, AckMessage, ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue, on
pop consumption (``broker.features.pop.model``), each a request (POP_RECEIVE, POP_ACK, POP_CHANGE,
POP_DEAD) to the leader of the group that holds the queue (``_leader_call``): this node's own
group through the broker API (``broker.frontends.grpc.owngroup``: in process on the leader,
forwarded once from a follower), another group through our client library.

A receipt handle names that group, the queue, the offset and the receipt's epoch,
``<group>/<queue id>/<offset>/<epoch>``, signed for the topic and consumer group
(``broker.frontends.grpc.handles``: a forged or altered one is refused before anything is asked).
The state machine checks a genuine one (the epoch must be the offset's current one), so a stale
handle acknowledges nothing. With ``--acl`` every call is its account's, judged by its
permissions (``broker.frontends.grpc.access``).

QueryAssignment gives a consumer one queue per group that serves the topic, with queue id -1:
a receive there takes messages from any of the group's queues of the topic (RocketMQ 5's pop
consumption); the instances of a consumer group share the queues message by message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as sv

from broker.features.pop.model import INVISIBLE_MS_MAX, INVISIBLE_MS_MIN
from broker.frontends.forward import LeaderForward
from broker.frontends.grpc.codec import GatewayError, code_of, guarded, log, outbound, status
from broker.frontends.grpc.handles import HandleSigner
from broker.frontends.grpc.owngroup import OwnGroup
from client import errors
from client.cluster.routes import GroupRoute, Routes, TopicRoute
from protocol import broker_kinds as bp
from protocol.errors import DLedgerError
from protocol.int_property import natural

DEFAULT_INVISIBLE_MS = 60_000  # a push consumer's receive (it names none; RocketMQ's default)
POLL_MS_MAX = 30_000
ACK_ENTRIES_MAX = 1024
DEADLINE_MARGIN_S = 1.0  # a long poll answers this long before the client's deadline


def handle_text(group: str, queue_id: int, offset: int, epoch: int) -> str:
    return f"{group}/{queue_id}/{offset}/{epoch}"


def parse_handle(text: str) -> tuple[str, int, int, int]:
    parts = text.split("/")
    numbers = [n for n in (natural(p, 19) for p in parts[1:]) if n is not None]
    if len(parts) != 4 or not parts[0] or len(numbers) != 3:
        raise GatewayError(pb.Code.INVALID_RECEIPT_HANDLE, f"not a receipt handle: {text[:80]!r}")
    return parts[0], numbers[0], numbers[1], numbers[2]


def filter_of(expression: Any) -> tuple[list[str], str]:
    """(tags, sql) of a FilterExpression: a TAG expression ``a || b`` or ``*``, or SQL92."""
    text = expression.expression.strip()
    if expression.type == pb.FilterType.SQL:
        if not text:
            raise GatewayError(pb.Code.ILLEGAL_FILTER_EXPRESSION, "an empty SQL92 expression")
        return ["*"], text
    if not text or text == "*":
        return ["*"], ""
    tags = [t.strip() for t in text.split("||")]
    if any(not t for t in tags):
        raise GatewayError(pb.Code.ILLEGAL_FILTER_EXPRESSION, f"bad tag expression {text!r}")
    return tags, ""


def duration_ms(duration: Any) -> int:
    return int(duration.seconds) * 1000 + int(duration.nanos) // 1_000_000


class ConsumeCalls:
    """The consuming RPCs, mixed into ``GrpcGateway`` (which provides these)."""

    own: OwnGroup
    routes: Routes
    other_groups: dict[str, LeaderForward]  # (with --acl: signed requests to other groups)
    calls: int
    max_delivery_attempts: int
    accepted_types: tuple[int, ...]
    endpoints_of: Callable[[GroupRoute, Any], Any]  # (a group, the request's Endpoints)
    handles: HandleSigner  # signs and checks receipt handles

    async def _ensure_routes(self) -> None:
        raise NotImplementedError

    async def _group_route(self, topic: str, group: str) -> GroupRoute:
        try:
            await self._ensure_routes()
            route = await self.routes.route(topic)
        except errors.ClientError as err:  # no NameServer answers, no group registered
            raise GatewayError(code_of(err), str(err)) from err
        for g in route.groups:
            if g.group == group:
                return g
        raise GatewayError(pb.Code.NOT_FOUND, f"group {group!r} does not serve {topic!r}")

    async def _leader_call(self, topic: str, group: str, kind: int, *args: Any,
                           timeout_s: float = 5.0) -> Any:
        """A request to the leader of ``group``; its named refusal as a ``GatewayError``. With
        access control on, a request to another group is signed as the call's account."""
        if group == self.own.group:
            return await self.own.call(kind, *args, timeout_s=timeout_s)
        g = await self._group_route(topic, group)
        try:
            credentials = self.own.credentials()
            if credentials is None:
                _, res = await self.routes.group_client(g).call_leader(kind, *args,
                                                                       timeout_s=timeout_s)
            else:
                res = await self._signed_forward(group)(kind, list(args), timeout_s, credentials)
        except (DLedgerError, errors.ClientError) as err:  # a named refusal, or the log's error
            raise GatewayError(code_of(err), str(err)) from err
        return res

    def _signed_forward(self, group: str) -> LeaderForward:
        """Requests to another group's leader signed as an account (its pools per account)."""
        forward = self.other_groups.get(group)
        if forward is None:
            forward = self.other_groups[group] = LeaderForward(group, self.routes,
                                                               self._ensure_routes)
        return forward

    async def _fresh_route(self, topic: str) -> TopicRoute:
        """The topic's route asked of the NameServers now (a client's route query)."""
        self.calls += 1
        await self._ensure_routes()
        return await self.routes.route(topic, refresh=True)

    def queue_of(self, topic: Any, g: GroupRoute, qid: int, permission: int,
                 endpoints: Any) -> Any:
        mq = pb.MessageQueue(id=qid, permission=permission,
                             accept_message_types=self.accepted_types)
        mq.topic.CopyFrom(topic)
        mq.broker.name = g.group
        mq.broker.endpoints.CopyFrom(endpoints)
        return mq

    @guarded(sv.QueryAssignmentResponse)
    async def QueryAssignment(self, request: Any, context: Any) -> Any:
        topic = request.topic.name
        try:
            route = await self._fresh_route(topic)
        except errors.ClientError as err:
            return sv.QueryAssignmentResponse(status=status(code_of(err), str(err)))
        out = []
        for g in route.groups:
            endpoints = self.endpoints_of(g, request.endpoints)
            if endpoints is None or not g.perm & 4 or g.read_queues == 0:
                continue
            out.append(pb.Assignment(message_queue=self.queue_of(
                request.topic, g, -1, pb.Permission.READ_WRITE, endpoints)))
        if not out:
            return sv.QueryAssignmentResponse(status=status(
                pb.Code.TOPIC_NOT_FOUND, f"no group serves {topic!r} to read over gRPC"))
        return sv.QueryAssignmentResponse(status=status(), assignments=out)

    async def ReceiveMessage(self, request: Any,
                             context: Any) -> AsyncIterator[Any]:
        self.calls += 1
        mq = request.message_queue
        topic, group = mq.topic.name, request.group.name
        try:
            if not group:
                raise GatewayError(pb.Code.ILLEGAL_CONSUMER_GROUP, "the request names no group")
            if not 0 < request.batch_size <= bp.MAX_PULL_MESSAGES:
                raise GatewayError(pb.Code.BAD_REQUEST,
                                   f"batch size must be 1..{bp.MAX_PULL_MESSAGES}")
            invisible_ms = duration_ms(request.invisible_duration) if request.HasField(
                "invisible_duration") else DEFAULT_INVISIBLE_MS
            if not INVISIBLE_MS_MIN <= invisible_ms <= INVISIBLE_MS_MAX:
                raise GatewayError(pb.Code.ILLEGAL_INVISIBLE_TIME,
                                   f"invisible duration must be {INVISIBLE_MS_MIN}.."
                                   f"{INVISIBLE_MS_MAX} ms")
            tags, sql = filter_of(request.filter_expression)
            poll_ms = min(duration_ms(request.long_polling_timeout), POLL_MS_MAX)
            remaining = context.time_remaining()
            if remaining is not None:
                poll_ms = max(0, min(poll_ms, int((remaining - DEADLINE_MARGIN_S) * 1000)))
            rows = await self._leader_call(
                topic, mq.broker.name, bp.POP_RECEIVE, group, topic, -1, request.batch_size,
                invisible_ms, tags, sql, poll_ms, self.max_delivery_attempts,
                timeout_s=poll_ms / 1000 + 5.0)
        except GatewayError as err:
            yield sv.ReceiveMessageResponse(status=status(err.code, str(err)))
            return
        except Exception as err:  # any bug: a named status, logged
            log.exception("gRPC ReceiveMessage failed")
            yield sv.ReceiveMessageResponse(status=status(pb.Code.INTERNAL_SERVER_ERROR,
                                                          f"{type(err).__name__}: {err}"))
            return
        if rows:  # when they left the server (clients measure delivery latency from it)
            delivered = sv.ReceiveMessageResponse()
            delivered.delivery_timestamp.GetCurrentTime()
            yield delivered
        for qid, off, body, tags_, keys, key, props, born, store, _, epoch, attempt in rows:
            handle = self.handles.sign_receipt(handle_text(mq.broker.name, qid, off, epoch),
                                               topic, group)
            yield sv.ReceiveMessageResponse(message=outbound(
                topic, qid, off, body, tags_, tuple(keys), key, tuple(map(tuple, props)), born,
                store, attempt, handle, invisible_ms))
        if rows:
            yield sv.ReceiveMessageResponse(status=status())
        else:
            yield sv.ReceiveMessageResponse(status=status(pb.Code.MESSAGE_NOT_FOUND,
                                                          "no new message"))

    @guarded(sv.AckMessageResponse)
    async def AckMessage(self, request: Any, context: Any) -> Any:
        self.calls += 1
        topic, group = request.topic.name, request.group.name
        if not 0 < len(request.entries) <= ACK_ENTRIES_MAX:
            return sv.AckMessageResponse(status=status(
                pb.Code.BAD_REQUEST, f"an ack names 1..{ACK_ENTRIES_MAX} receipts"))
        results = []
        for entry in request.entries:
            try:
                broker, qid, off, epoch = parse_handle(
                    self.handles.open_receipt(entry.receipt_handle, topic, group))
                (ok,) = await self._leader_call(topic, broker, bp.POP_ACK, group, topic, qid,
                                                [[off, epoch]])
                st = status() if ok else status(pb.Code.INVALID_RECEIPT_HANDLE,
                                                "the receipt is stale: delivered again since")
            except GatewayError as err:
                st = status(err.code, str(err))
            results.append(sv.AckMessageResultEntry(message_id=entry.message_id,
                                                    receipt_handle=entry.receipt_handle,
                                                    status=st))
        codes = {r.status.code for r in results}
        overall = status() if codes == {pb.Code.OK} else (
            results[0].status if len(codes) == 1 else status(pb.Code.MULTIPLE_RESULTS, "mixed"))
        return sv.AckMessageResponse(status=overall, entries=results)

    @guarded(sv.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(self, request: Any, context: Any) -> Any:
        self.calls += 1
        topic, group = request.topic.name, request.group.name
        try:
            broker, qid, off, epoch = parse_handle(
                self.handles.open_receipt(request.receipt_handle, topic, group))
            invisible_ms = duration_ms(request.invisible_duration)
            if not INVISIBLE_MS_MIN <= invisible_ms <= INVISIBLE_MS_MAX:
                raise GatewayError(pb.Code.ILLEGAL_INVISIBLE_TIME,
                                   f"invisible duration must be {INVISIBLE_MS_MIN}.."
                                   f"{INVISIBLE_MS_MAX} ms")
            new_epoch = await self._leader_call(topic, broker, bp.POP_CHANGE, group, topic, qid,
                                                off, epoch, invisible_ms)
        except GatewayError as err:
            return sv.ChangeInvisibleDurationResponse(status=status(err.code, str(err)))
        return sv.ChangeInvisibleDurationResponse(status=status(), receipt_handle=(
            self.handles.sign_receipt(handle_text(broker, qid, off, new_epoch), topic, group)))

    @guarded(sv.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(self, request: Any,
                                              context: Any) -> Any:
        self.calls += 1
        topic, group = request.topic.name, request.group.name
        try:
            broker, qid, off, epoch = parse_handle(
                self.handles.open_receipt(request.receipt_handle, topic, group))
            await self._leader_call(topic, broker, bp.POP_DEAD, group, topic, qid, off, epoch,
                                    max(1, request.max_delivery_attempts or 1))
        except GatewayError as err:
            return sv.ForwardMessageToDeadLetterQueueResponse(status=status(err.code, str(err)))
        return sv.ForwardMessageToDeadLetterQueueResponse(status=status())


__all__ = ["ConsumeCalls", "duration_ms", "filter_of", "handle_text", "parse_handle"]
