"""The gRPC endpoint for RocketMQ 5 clients (``--grpc-listen``): the shell that serves
``apache.rocketmq.v2.MessagingService`` on ``grpc.aio`` in the broker's event loop.

Owns the gRPC server, the clients' telemetry sessions (``GatewaySessions``), and the
translation of each call into requests of our own client protocol. Those go through our
client library's routing (``client.cluster.routes`` / ``client.producer.delivery``) to the leader of the group
that owns the queue, wherever that leader is: a RocketMQ 5 client does not follow redirects,
so the endpoint a client was given for a group keeps working across leader changes, this node
forwarding what it does not lead. Reads of committed data could be served by any replica;
this first cut forwards everything to the leader.

``QueryRoute`` answers every group that serves the topic, each with the gRPC addresses of its
nodes as registered with the NameServers (``Endpoints`` with several addresses: the client's
channel picks one and moves to another when it fails). The protocol's pure half (messages,
codes) is ``broker.frontends.grpc.codec``.

Calls not served yet answer with the protocol's NOT_IMPLEMENTED status (never hang).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import zlib
from typing import TYPE_CHECKING, Any, AsyncIterator

import grpc
from grpc import aio
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as sv
from rocketmq.grpc_protocol import service_pb2_grpc as sg

from broker.frontends.grpc.codec import GatewayError, code_of, guarded, inbound, status
from broker.frontends.grpc.consume import ConsumeCalls
from broker.frontends.grpc.sends import GatewaySends
from broker.frontends.grpc.txn import GatewayTransactions, parse_txn, txn_group, txn_text
from client import errors
from client.producer.delivery import Delivery
from client.cluster.routes import GroupRoute, Routes
from client.types import MessageQueue
from protocol import broker_kinds as bp
from protocol.tls import TlsConfig

if TYPE_CHECKING:
    from broker.api.broker import Broker

log = logging.getLogger("broker.grpc")

Address = tuple[str, int]
ACCEPTED_TYPES = (pb.MessageType.NORMAL, pb.MessageType.FIFO, pb.MessageType.DELAY,
                  pb.MessageType.TRANSACTION)
SEND_TIMEOUT_S = 3.0  # a send's deadline inside the cluster (the client's default is 3 s too)
TELEMETRY_QUEUE_MAX = 64  # commands waiting to go out on one client's telemetry stream
GRPC_MESSAGE_BYTES_MAX = 16 << 20
# What a client is told in its settings (RocketMQ proxy's defaults)
SEND_ATTEMPTS_MAX = 3
BACKOFF_INITIAL_MS, BACKOFF_MAX_MS, BACKOFF_MULTIPLIER = 10, 1000, 2.0
RECEIVE_BATCH_SIZE = 32
LONG_POLLING_S = 30


def _server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """gRPC's TLS from the broker's --tls-* files (gRPC's own TLS stack, not Python's ssl)."""
    with open(tls.key_file, "rb") as f:
        key = f.read()
    with open(tls.cert_file, "rb") as f:
        chain = f.read()
    return grpc.ssl_server_credentials([(key, chain)])


def _metadata(context: Any, name: str) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == name:
            return str(value)
    return ""


class GrpcGateway(ConsumeCalls, sg.MessagingServiceServicer):  # type: ignore[misc]
    """One broker node's gRPC endpoint (see the module docstring)."""

    def __init__(self, server: Broker, listen: Address) -> None:
        self.server = server
        self.listen = listen
        self.group = server.config.node.group
        self.max_body_bytes = server.config.max_message_bytes
        tls = server.config.node.tls
        self.tls = tls
        self.routes = Routes(list(server.config.namesrv),  # its calls into the cluster: TLS too
                             ssl_context=tls.dial_context() if tls is not None else None,
                             from_env=False)
        self.delivery = Delivery(self.routes)
        self.sends = GatewaySends(self.delivery, SEND_TIMEOUT_S)
        self._grpc: aio.Server | None = None
        self._routes_started = False
        self._round_robin: dict[str, itertools.count[int]] = {}
        self.sessions: dict[str, asyncio.Queue[Any]] = {}  # client id -> its telemetry outbox
        self.calls = 0
        self.address: Address | None = None
        self.max_delivery_attempts = server.config.grpc_max_delivery_attempts
        self.accepted_types = ACCEPTED_TYPES
        self.endpoints_of = _endpoints
        self.txns = GatewayTransactions(self.routes, f"grpc-gateway-{self.group}-"
                                        f"{server.config.node.node_id}", self.sessions,
                                        self._ensure_routes)

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> Address:
        self._grpc = aio.server(options=[
            ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES_MAX),
            ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES_MAX),
            ("grpc.so_reuseport", 0),
        ])
        sg.add_MessagingServiceServicer_to_server(self, self._grpc)
        host, port = self.listen
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if self.tls is None:
            bound = self._grpc.add_insecure_port(where)
        else:
            bound = self._grpc.add_secure_port(where, _server_credentials(self.tls))
        if bound == 0:
            raise OSError(f"cannot listen for gRPC at {host}:{port}")
        await self._grpc.start()
        self.txns.start()
        self.address = (host, bound)
        return self.address

    async def stop(self) -> None:
        await self.txns.stop()
        await self.sends.close()
        if self._grpc is not None:
            await self._grpc.stop(grace=0.5)
            self._grpc = None
        for outbox in self.sessions.values():
            outbox.put_nowait(None)
        self.sessions.clear()
        if self._routes_started:
            await self.routes.close()

    async def _ensure_routes(self) -> None:
        if not self._routes_started:
            await self.routes.start()  # fails fast (UnavailableError) while no NameServer answers
            self._routes_started = True

    # -- routes -------------------------------------------------------------------------------------

    @guarded(sv.QueryRouteResponse)
    async def QueryRoute(self, request: Any, context: Any) -> Any:
        topic = request.topic.name
        try:
            route = await self._fresh_route(topic)
        except errors.ClientError as err:
            return sv.QueryRouteResponse(status=status(code_of(err), str(err)))
        queues = []
        for g in route.groups:
            endpoints = _endpoints(g)
            if endpoints is None:
                continue
            for qid in range(max(g.read_queues, g.write_queues)):
                perm = (1 if qid < g.read_queues and g.perm & 4 else 0) \
                    | (2 if qid < g.write_queues and g.perm & 2 else 0)
                queues.append(self.queue_of(request.topic, g, qid, _PERMISSIONS[perm], endpoints))
        if not queues:
            return sv.QueryRouteResponse(status=status(
                pb.Code.TOPIC_NOT_FOUND if not route.groups else pb.Code.HA_NOT_AVAILABLE,
                f"no group serves {topic!r} over gRPC"))
        return sv.QueryRouteResponse(status=status(), message_queues=queues)

    # -- sending --------------------------------------------------------------------------------------

    @guarded(sv.SendMessageResponse)
    async def SendMessage(self, request: Any, context: Any) -> Any:
        self.calls += 1
        if len(request.messages) != 1:
            return sv.SendMessageResponse(status=status(
                pb.Code.BAD_REQUEST, "send one message per request (batches are not supported)"))
        try:
            await self._ensure_routes()
            now_ms = int(time.time() * 1000)
            msg = inbound(request.messages[0], self.max_body_bytes, now_ms,
                          self.server.config.max_delay_ms)
            txn_id = ""
            if msg.kind in (pb.MessageType.NORMAL, pb.MessageType.DELAY):
                result = await self.sends.send(msg.topic, msg.row,
                                               msg.kind == pb.MessageType.DELAY)
                offset = result.queue_offset
            elif msg.kind == pb.MessageType.TRANSACTION:
                mq = await self._choose_queue(msg.topic, msg.message_group)
                offset = await self._half(mq, msg.message_id, msg.row)
                txn_id = txn_text(mq.group, msg.message_id)
            else:
                mq = await self._choose_queue(msg.topic, msg.message_group)
                result = await self.delivery.to_queue([msg.row], mq,
                                                      time.monotonic() + SEND_TIMEOUT_S)
                offset = result.queue_offset
        except (GatewayError, errors.ClientError) as err:
            code = code_of(err)
            return sv.SendMessageResponse(status=status(code, str(err)),
                                          entries=[sv.SendResultEntry(status=status(code, str(err)))])
        entry = sv.SendResultEntry(status=status(), message_id=msg.message_id,
                                   transaction_id=txn_id, offset=offset)
        return sv.SendMessageResponse(status=status(), entries=[entry])

    async def _half(self, mq: MessageQueue, message_id: str, row: list[Any]) -> int:
        """A half message of the transaction named by the message id (``broker.frontends.grpc.txn``)."""
        got = await self._leader_call(mq.topic, mq.group, bp.TXN_HALF, txn_group(mq.topic),
                                      message_id, mq.topic, mq.queue_id, [row])
        return int(got[2][0])

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

    async def _choose_queue(self, topic: str, message_group: str) -> MessageQueue:
        """The queue a message goes to: in this node's group if it serves the topic (the client
        chose this group's endpoint), else in any group that takes writes; a FIFO message's
        queue by its group's hash (its messages stay in one queue, in order), others round
        robin."""
        route = await self.routes.route(topic)
        writable = [g for g in route.groups if g.perm & 2 and g.write_queues > 0]
        if not writable:
            raise errors.NoPermissionError(f"no group takes writes to {topic!r}")
        own = [g for g in writable if g.group == self.group]
        if message_group:
            g = own[0] if own else writable[zlib.crc32(message_group.encode()) % len(writable)]
            return MessageQueue(topic, g.group, zlib.crc32(message_group.encode()) % g.write_queues)
        pool = [(g, q) for g in (own or writable) for q in range(g.write_queues)]
        n = next(self._round_robin.setdefault(topic, itertools.count()))
        g, q = pool[n % len(pool)]
        return MessageQueue(topic, g.group, q)

    # -- clients --------------------------------------------------------------------------------------

    async def Heartbeat(self, request: Any, context: Any) -> Any:
        self.calls += 1
        return sv.HeartbeatResponse(status=status())

    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        self.calls += 1
        return sv.NotifyClientTerminationResponse(status=status())

    async def Telemetry(self, request_iterator: AsyncIterator[Any],
                        context: Any) -> AsyncIterator[Any]:
        """The client's settings are answered with the server's; commands the server sends
        (transaction check-back) go out through the session's outbox."""
        self.calls += 1
        client_id = _metadata(context, "x-mq-client-id")
        if not client_id:
            yield sv.TelemetryCommand(status=status(pb.Code.CLIENT_ID_REQUIRED,
                                                    "the x-mq-client-id header is missing"))
            return
        outbox: asyncio.Queue[Any] = asyncio.Queue(TELEMETRY_QUEUE_MAX)
        old = self.sessions.get(client_id)
        if old is not None:
            old.put_nowait(None)  # a newer stream of the same client replaces it
        self.sessions[client_id] = outbox

        async def read() -> None:
            try:
                async for cmd in request_iterator:
                    if cmd.WhichOneof("command") == "settings" \
                            and cmd.settings.client_type == pb.ClientType.PRODUCER:
                        self.txns.producer_settings(client_id, frozenset(
                            t.name for t in cmd.settings.publishing.topics))
                    reply = self._telemetry_reply(cmd)
                    if reply is not None:
                        await outbox.put(reply)
            finally:
                await outbox.put(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while True:
                cmd = await outbox.get()
                if cmd is None:
                    break
                yield cmd
        finally:
            reader.cancel()
            if self.sessions.get(client_id) is outbox:
                del self.sessions[client_id]
                self.txns.session_ended(client_id)

    def _telemetry_reply(self, cmd: Any) -> Any:
        which = cmd.WhichOneof("command")
        if which == "settings":
            return sv.TelemetryCommand(status=status(), settings=self._settings(cmd.settings))
        if which in ("thread_stack_trace", "verify_message_result"):
            return None  # answers to commands this server does not send: nothing to do
        return sv.TelemetryCommand(status=status(pb.Code.NOT_IMPLEMENTED,
                                                 f"telemetry command {which} is not supported"))

    def _settings(self, theirs: Any) -> Any:
        s = pb.Settings()
        s.CopyFrom(theirs)
        s.backoff_policy.Clear()
        if theirs.client_type == pb.ClientType.PRODUCER:
            s.backoff_policy.max_attempts = SEND_ATTEMPTS_MAX
            s.publishing.max_body_size = self.max_body_bytes
            s.publishing.validate_message_type = True
        else:
            s.backoff_policy.max_attempts = self.max_delivery_attempts
            s.subscription.receive_batch_size = RECEIVE_BATCH_SIZE
            s.subscription.long_polling_timeout.seconds = LONG_POLLING_S
        backoff = s.backoff_policy.exponential_backoff
        backoff.initial.FromMilliseconds(BACKOFF_INITIAL_MS)
        backoff.max.FromMilliseconds(BACKOFF_MAX_MS)
        backoff.multiplier = BACKOFF_MULTIPLIER
        s.metric.on = False
        return s

    # -- not served yet: a protocol status, never a hang -----------------------------------------

    async def PullMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        yield sv.PullMessageResponse(status=_not_yet("PullMessage"))

    async def UpdateOffset(self, request: Any, context: Any) -> Any:
        return sv.UpdateOffsetResponse(status=_not_yet("UpdateOffset"))

    async def GetOffset(self, request: Any, context: Any) -> Any:
        return sv.GetOffsetResponse(status=_not_yet("GetOffset"))

    async def QueryOffset(self, request: Any, context: Any) -> Any:
        return sv.QueryOffsetResponse(status=_not_yet("QueryOffset"))

    async def RecallMessage(self, request: Any, context: Any) -> Any:
        return sv.RecallMessageResponse(status=_not_yet("RecallMessage"))

    async def SyncLiteSubscription(self, request: Any, context: Any) -> Any:
        return sv.SyncLiteSubscriptionResponse(status=_not_yet("SyncLiteSubscription"))


_PERMISSIONS = {0: pb.Permission.NONE, 1: pb.Permission.READ, 2: pb.Permission.WRITE,
                3: pb.Permission.READ_WRITE}


def _not_yet(rpc: str) -> Any:
    return status(pb.Code.NOT_IMPLEMENTED, f"{rpc} is not supported by this endpoint")


def _endpoints(g: GroupRoute) -> Any:
    """The group's nodes' gRPC addresses as one ``Endpoints`` (None: none serves gRPC)."""
    addrs = sorted(g.grpc.values())
    if not addrs:
        return None
    e = pb.Endpoints(scheme=_scheme(addrs[0][0]))
    if e.scheme == pb.AddressScheme.DOMAIN_NAME:
        addrs = addrs[:1]  # the protocol allows one address of a domain name
    for host, port in addrs:
        e.addresses.add(host=host, port=port)
    return e


def _scheme(host: str) -> int:
    import ipaddress
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return int(pb.AddressScheme.DOMAIN_NAME)
    return int(pb.AddressScheme.IPv4 if ip.version == 4 else pb.AddressScheme.IPv6)

