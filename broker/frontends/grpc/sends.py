"""The sending calls of the gRPC endpoint (``broker.frontends.grpc.gateway``): SendMessage (NORMAL,
FIFO, DELAY and TRANSACTION half messages) and EndTransaction.

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

from broker.frontends.grpc.codec import GatewayError, code_of, guarded, inbound, status, status_code
from broker.frontends.grpc.owngroup import SEND_OK, OwnGroup
from broker.frontends.grpc.txn import parse_txn, txn_group, txn_text
from client import errors
from client.cluster.routes import Routes
from client.producer.delivery import Delivery
from client.types import MessageQueue
from protocol import broker_kinds as bp

SEND_TIMEOUT_S = 3.0  # a send's deadline inside the cluster (the client's default is 3 s too)

__all__ = ["SEND_TIMEOUT_S", "SendCalls"]


class SendCalls:
    """The sending RPCs, mixed into ``GrpcGateway`` (which provides these)."""

    own: OwnGroup
    routes: Routes
    delivery: Delivery
    calls: int
    max_body_bytes: int
    max_delay_ms: int
    _round_robin: dict[str, itertools.count[int]]

    if TYPE_CHECKING:  # (the gateway's and ``ConsumeCalls``')
        async def _ensure_routes(self) -> None: ...

        async def _leader_call(self, topic: str, group: str, kind: int, *args: Any,
                               timeout_s: float = 5.0) -> Any: ...

    @guarded(sv.SendMessageResponse)
    async def SendMessage(self, request: Any, context: Any) -> Any:
        self.calls += 1
        if len(request.messages) != 1:
            return sv.SendMessageResponse(status=status(
                pb.Code.BAD_REQUEST, "send one message per request (batches are not supported)"))
        try:
            msg = inbound(request.messages[0], self.max_body_bytes, int(time.time() * 1000),
                          self.max_delay_ms)
            queues = await self.own.write_queues(msg.topic)
            if queues is None:
                offset, txn_id = await self._send_elsewhere(msg.topic, msg.kind,
                                                            msg.message_group, msg.message_id,
                                                            msg.row)
            elif msg.kind == pb.MessageType.TRANSACTION:
                qid = self.own.queue_id(queues, msg.message_group)
                got = await self.own.call(bp.TXN_HALF, txn_group(msg.topic), msg.message_id,
                                          msg.topic, qid, [msg.row], timeout_s=SEND_TIMEOUT_S)
                offset, txn_id = int(got[2][0]), txn_text(self.own.group, msg.message_id)
            else:  # NORMAL, DELAY (the send path routes it to the schedule topic), FIFO
                answer = await self.own.send(msg.topic,
                                             self.own.queue_id(queues, msg.message_group),
                                             msg.row)
                offset, txn_id = int(answer[2][0]), ""
        except (GatewayError, errors.ClientError) as err:
            code = code_of(err)
            return sv.SendMessageResponse(status=status(code, str(err)),
                                          entries=[sv.SendResultEntry(status=status(code, str(err)))])
        entry = sv.SendResultEntry(status=status(), message_id=msg.message_id,
                                   transaction_id=txn_id, offset=offset)
        return sv.SendMessageResponse(status=status(), entries=[entry])

    async def _send_elsewhere(self, topic: str, kind: int, message_group: str, message_id: str,
                              row: list[Any]) -> tuple[int, str]:
        """A message for a topic other groups serve: (its queue offset, its transaction id)."""
        await self._ensure_routes()
        mq = await self._choose_queue(topic, message_group)
        if kind == pb.MessageType.TRANSACTION:
            got = await self._leader_call(mq.topic, mq.group, bp.TXN_HALF, txn_group(mq.topic),
                                          message_id, mq.topic, mq.queue_id, [row])
            return int(got[2][0]), txn_text(mq.group, message_id)
        if self.own.broker.acl.enabled:  # signed as the call's account
            (answer,) = await self._leader_call(mq.topic, mq.group, bp.SEND_RUNS,
                                                [[mq.topic, mq.queue_id, [row]]],
                                                timeout_s=SEND_TIMEOUT_S)
            if answer[0] != SEND_OK:
                raise GatewayError(status_code(answer[0]), f"{answer[0]}: {answer[1]}")
            return int(answer[2][0]), ""
        result = await self.delivery.to_queue([row], mq, time.monotonic() + SEND_TIMEOUT_S)
        return result.queue_offset, ""

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
