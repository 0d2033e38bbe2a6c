"""The sending calls of the gRPC endpoint (``broker.frontends.grpc.gateway``): SendMessage (NORMAL,
FIFO, DELAY and TRANSACTION half messages; a batch of NORMAL or FIFO messages), EndTransaction and
RecallMessage.

A batch (several messages in one SendMessage) is one SEND of the broker's: one topic, one queue,
all or nothing in one log entry, each message answered with its own receipt, in order; its
refusals are named (``check_batch``). A DELAY message's receipt carries a recall handle
(``broker.frontends.grpc.handles``: signed, naming the group and where the message is stored),
which RecallMessage takes back to that group's leader.

A message for a topic this node's group serves goes to one of the group's queues through the
broker API (``broker.frontends.grpc.owngroup``): on the leader into the send path in this
process, on a follower forwarded once to the leader; concurrent calls travel together as one
request and one log entry (``broker.frontends.gather``). A FIFO message goes to the queue its
message group's hash selects, others round robin; a TRANSACTION message is a half message
(TXN_HALF) of the transaction its message id names, ended by EndTransaction (END_TRANSACTION).

Only a topic the NameServers say other groups serve (and this one does not) goes elsewhere:
through our client library to the leader of one of those groups (``client.producer.delivery`` for a
message, ``_leader_call`` for a half message or an end), as before the endpoint served its
own group in process; with access control on, every one of them through ``_leader_call``,
signed as the call's account.
"""

from __future__ import annotations

import itertools
import time
import zlib
from typing import TYPE_CHECKING, Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as sv

from broker.frontends.grpc.codec import (
    PROP_DELIVER_MS,
    GatewayError,
    Inbound,
    code_of,
    guarded,
    inbound,
    status,
    status_code,
)
from broker.frontends.grpc.handles import HandleSigner, RecallTarget
from broker.frontends.grpc.owngroup import SEND_OK, OwnGroup
from broker.frontends.grpc.txn import parse_txn, txn_group, txn_text
from client import errors
from client.cluster.routes import Routes
from client.producer.delivery import Delivery
from client.types import MessageQueue
from protocol import broker_kinds as bp

SEND_TIMEOUT_S = 3.0  # a send's deadline inside the cluster (the client's default is 3 s too)
BATCH_MESSAGES_MAX = 1024  # messages in one SendMessage
# A seeded bug (tests only; broker.config.GRPC_CANARIES): a batch's first half is stored alone
# and the send answered as failed, so the batch checker must find it torn.
BATCH_TORN = "grpc_batch_torn"
Stored = tuple[int, str, str]  # a stored message's queue offset, transaction id, offset msg id

__all__ = ["BATCH_MESSAGES_MAX", "BATCH_TORN", "SEND_TIMEOUT_S", "SendCalls", "check_batch"]


def check_batch(msgs: list[Inbound], max_bytes: int) -> None:
    """A batch's rules (RocketMQ's, and ours for FIFO), each refusal named: one topic; NORMAL
    or FIFO messages, not both (DELAY and TRANSACTION messages are sent one by one, as
    RocketMQ's batch refuses them); FIFO messages of one message group (the batch goes to one
    queue); distinct message ids; the bodies within the broker's maximum together (the broker
    counts the whole batch too)."""
    topics = {m.topic for m in msgs}
    if len(topics) > 1:
        raise GatewayError(pb.Code.BAD_REQUEST, f"a batch's messages share one topic, not "
                                                f"{', '.join(sorted(topics)[:4])}")
    kinds = {m.kind for m in msgs}
    for kind in (pb.MessageType.DELAY, pb.MessageType.TRANSACTION):
        if kind in kinds:
            raise GatewayError(pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                               f"a batch cannot hold {pb.MessageType.Name(kind)} messages "
                               "(RocketMQ's rule): send them one by one")
    if len(kinds) > 1:
        raise GatewayError(pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                           "a batch's messages are all NORMAL or all FIFO")
    groups = {m.message_group for m in msgs}
    if len(groups) > 1:
        raise GatewayError(pb.Code.ILLEGAL_MESSAGE_GROUP, "a batch's FIFO messages share one "
                           f"message group, not {', '.join(sorted(groups)[:4])}")
    seen: set[str] = set()
    for m in msgs:
        if m.message_id in seen:
            raise GatewayError(pb.Code.ILLEGAL_MESSAGE_ID,
                               f"message id {m.message_id!r} is twice in the batch")
        seen.add(m.message_id)
    size = sum(len(m.row[0]) for m in msgs)
    if size > max_bytes:
        raise GatewayError(pb.Code.PAYLOAD_TOO_LARGE,
                           f"a batch of {size} bytes of bodies exceeds {max_bytes}")


class SendCalls:
    """The sending RPCs, mixed into ``GrpcGateway`` (which provides these)."""

    own: OwnGroup
    routes: Routes
    delivery: Delivery
    calls: int
    max_body_bytes: int
    max_delay_ms: int
    handles: HandleSigner
    _round_robin: dict[str, itertools.count[int]]

    if TYPE_CHECKING:  # (the gateway's and ``ConsumeCalls``')
        async def _ensure_routes(self) -> None: ...

        async def _leader_call(self, topic: str, group: str, kind: int, *args: Any,
                               timeout_s: float = 5.0) -> Any: ...

    @guarded(sv.SendMessageResponse)
    async def SendMessage(self, request: Any, context: Any) -> Any:
        self.calls += 1
        try:
            if not 0 < len(request.messages) <= BATCH_MESSAGES_MAX:
                raise GatewayError(pb.Code.BAD_REQUEST, f"a send carries 1..{BATCH_MESSAGES_MAX} "
                                                        f"messages, not {len(request.messages)}")
            now_ms = int(time.time() * 1000)
            msgs = [inbound(m, self.max_body_bytes, now_ms, self.max_delay_ms)
                    for m in request.messages]
            stored = [await self._send_one(msgs[0])] if len(msgs) == 1 \
                else await self._send_batch(msgs)
        except (GatewayError, errors.ClientError) as err:
            code = code_of(err)
            return sv.SendMessageResponse(status=status(code, str(err)), entries=[
                sv.SendResultEntry(status=status(code, str(err)))] * max(1, len(request.messages)))
        entries = [sv.SendResultEntry(status=status(), message_id=m.message_id,
                                      transaction_id=txn_id, offset=offset,
                                      recall_handle=self._recall_handle(m, where))
                   for m, (offset, txn_id, where) in zip(msgs, stored)]
        return sv.SendMessageResponse(status=status(), entries=entries)

    async def _send_one(self, msg: Inbound) -> Stored:
        queues = await self.own.write_queues(msg.topic)
        if queues is None:
            return await self._send_elsewhere(msg.topic, msg.kind, msg.message_group,
                                              msg.message_id, msg.row)
        qid = self.own.queue_id(queues, msg.message_group)
        if msg.kind == pb.MessageType.TRANSACTION:
            got = await self.own.call(bp.TXN_HALF, txn_group(msg.topic), msg.message_id,
                                      msg.topic, qid, [msg.row], timeout_s=SEND_TIMEOUT_S)
            return int(got[2][0]), txn_text(self.own.group, msg.message_id), str(got[3][0])
        # NORMAL, DELAY (the send path routes it to the schedule topic), FIFO
        answer = await self.own.send(msg.topic, qid, msg.row)
        return int(answer[2][0]), "", str(answer[3][0])

    async def _send_batch(self, msgs: list[Inbound]) -> list[Stored]:
        """Several messages of one topic as one SEND (RocketMQ's batch): one queue, stored all
        or nothing in one log entry, contiguous and in order; a FIFO batch's messages share
        one message group, whose queue they go to."""
        first = msgs[0]
        check_batch(msgs, self.max_body_bytes)
        rows = [m.row for m in msgs]
        queues = await self.own.write_queues(first.topic)
        if queues is None:  # a topic other groups serve
            await self._ensure_routes()
            mq = await self._choose_queue(first.topic, first.message_group)
            answer = await self._leader_call(mq.topic, mq.group, bp.SEND, mq.topic, mq.queue_id,
                                             rows, timeout_s=SEND_TIMEOUT_S)
        else:
            qid = self.own.queue_id(queues, first.message_group)
            if BATCH_TORN in self.own.broker.config.canaries:  # a seeded bug (tests only)
                await self.own.call(bp.SEND, first.topic, qid, rows[:len(rows) // 2],
                                    timeout_s=SEND_TIMEOUT_S)
                raise GatewayError(pb.Code.HA_NOT_AVAILABLE,
                                   f"{BATCH_TORN}: the batch's first half stored alone")
            answer = await self.own.call(bp.SEND, first.topic, qid, rows,
                                         timeout_s=SEND_TIMEOUT_S)
        return [(int(off), "", str(where)) for off, where in zip(answer[2], answer[3])]

    def _recall_handle(self, msg: Inbound, where: str) -> str:
        """A DELAY message's signed recall handle ("" for other messages, and for one due
        already when it came: not delayed): the group and place its send's answer named."""
        due = next((v for n, v in msg.row[4] if n == PROP_DELIVER_MS), None)
        if msg.kind != pb.MessageType.DELAY or due is None or not where:
            return ""
        group, position, slot = bp.parse_offset_msg_id(where)
        return self.handles.sign_recall(RecallTarget(group, msg.topic, msg.message_id,
                                                     position, slot, int(due)))

    @guarded(sv.RecallMessageResponse)
    async def RecallMessage(self, request: Any, context: Any) -> Any:
        """A delayed message recalled by the handle its send answered with: never delivered
        (``broker.features.delay.handlers``: a log entry, so a new leader knows it too); once
        delivered, NOT_FOUND naming NOT_RECALLABLE; a handle this cluster did not issue,
        BAD_REQUEST."""
        self.calls += 1
        topic = request.topic.name
        try:
            if not topic:
                raise GatewayError(pb.Code.ILLEGAL_TOPIC, "the request names no topic")
            t = self.handles.open_recall(request.recall_handle, topic)
            recalled = await self._leader_call(topic, t.group, bp.RECALL, topic, t.message_id,
                                               t.position, t.slot, timeout_s=SEND_TIMEOUT_S)
        except GatewayError as err:  # (the clients take MESSAGE_NOT_FOUND for "none": success)
            code = pb.Code.NOT_FOUND if err.code == pb.Code.MESSAGE_NOT_FOUND else err.code
            return sv.RecallMessageResponse(status=status(code, str(err)))
        return sv.RecallMessageResponse(status=status(), message_id=str(recalled))

    async def _send_elsewhere(self, topic: str, kind: int, message_group: str, message_id: str,
                              row: list[Any]) -> Stored:
        """A message for a topic other groups serve: its queue offset, transaction id and
        offset msg id."""
        await self._ensure_routes()
        mq = await self._choose_queue(topic, message_group)
        if kind == pb.MessageType.TRANSACTION:
            got = await self._leader_call(mq.topic, mq.group, bp.TXN_HALF, txn_group(mq.topic),
                                          message_id, mq.topic, mq.queue_id, [row])
            return int(got[2][0]), txn_text(mq.group, message_id), str(got[3][0])
        if self.own.broker.acl.enabled:  # signed as the call's account
            (answer,) = await self._leader_call(mq.topic, mq.group, bp.SEND_RUNS,
                                                [[mq.topic, mq.queue_id, [row]]],
                                                timeout_s=SEND_TIMEOUT_S)
            if answer[0] != SEND_OK:
                raise GatewayError(status_code(answer[0]), f"{answer[0]}: {answer[1]}")
            return int(answer[2][0]), "", str(answer[3][0])
        result = await self.delivery.to_queue([row], mq, time.monotonic() + SEND_TIMEOUT_S)
        return result.queue_offset, "", result.offset_msg_id

    async def _choose_queue(self, topic: str, message_group: str) -> MessageQueue:
        """A queue of a group that takes writes to ``topic``: a FIFO message's by its group's
        hash (its messages stay in one queue, in order), others round robin."""
        route = await self.routes.route(topic)
        writable = [g for g in route.groups if g.perm & 2 and g.write_queues > 0]
        if not writable:
            raise errors.NoPermissionError(f"no group takes writes to {topic!r}")
        if message_group:
            h = zlib.crc32(message_group.encode())
            g = writable[h % len(writable)]
            return MessageQueue(topic, g.group, h % g.write_queues)
        pool = [(g, q) for g in writable for q in range(g.write_queues)]
        n = next(self._round_robin.setdefault(topic, itertools.count()))
        g, q = pool[n % len(pool)]
        return MessageQueue(topic, g.group, q)

    @guarded(sv.EndTransactionResponse)
    async def EndTransaction(self, request: Any, context: Any) -> Any:
        self.calls += 1
        topic = request.topic.name
        try:
            group, txn_id = parse_txn(request.transaction_id)
            if request.resolution == pb.TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED:
                # the producer does not know yet (a Java client's UNKNOWN): it stays open, and the
                # broker asks again at its next check (RocketMQ's answer to an unknown state)
                return sv.EndTransactionResponse(status=status())
            if request.resolution not in (pb.TransactionResolution.COMMIT,
                                          pb.TransactionResolution.ROLLBACK):
                raise GatewayError(pb.Code.BAD_REQUEST, "the resolution is COMMIT or ROLLBACK")
            decision = "COMMIT" if request.resolution == pb.TransactionResolution.COMMIT \
                else "ROLLBACK"
            await self._leader_call(topic, group, bp.END_TRANSACTION, txn_group(topic), txn_id,
                                    decision,
                                    request.source == pb.TransactionSource.SOURCE_SERVER_CHECK,
                                    [])
        except GatewayError as err:
            return sv.EndTransactionResponse(status=status(err.code, str(err)))
        return sv.EndTransactionResponse(status=status())
