"""The gRPC endpoint for RocketMQ 5 clients (``--grpc-listen``): the shell that serves
``apache.rocketmq.v2.MessagingService`` on ``grpc.aio`` in the broker's event loop, a thin
adapter over the in-process broker API.

Owns the gRPC server, the clients' telemetry sessions (settings, and the transaction check-backs
``broker.frontends.grpc.txn`` hands them) and the route answers. Each call becomes a request of the
broker's kinds: for a queue of this node's group through the broker API
(``broker.frontends.grpc.owngroup``; in process on the leader, forwarded once from a follower, as a
RocketMQ 5 client does not follow redirects: the endpoint a client was given for a group keeps
working across leader changes); for a queue of another group through our client library's routing
(``client.cluster.routes`` / ``client.producer.delivery``) to that group's leader. The sending calls
are ``broker.frontends.grpc.sends``', the consuming ones ``broker.frontends.grpc.consume``'s, the
pull consumer's ``broker.frontends.grpc.pull``'s. Receipt and recall handles are signed with a key
from the cluster credential (``broker.frontends.grpc.handles``).

``QueryRoute`` answers every group that serves the topic, each queue once per node serving gRPC
(the addresses registered with the NameServers), one address per ``Endpoints`` as RocketMQ's
proxy gives them (``broker.frontends.grpc.route``): a client may call any node, which forwards.
The protocol's pure half (messages, codes) is ``broker.frontends.grpc.codec``.

With ``--acl`` every call is authenticated by its RocketMQ 5 signature and served as its account
(``broker.frontends.grpc.access``); with the node's ``--tls-*`` files the listener speaks TLS.

Calls not served yet answer with the protocol's NOT_IMPLEMENTED status (never hang).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
from grpc import aio
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as sv
from rocketmq.grpc_protocol import service_pb2_grpc as sg

from broker.api.api import ACTING
from broker.frontends.forward import LeaderForward, RoutesOnce
from broker.frontends.grpc.access import AccessInterceptor, secret_reader, txn_signing
from broker.frontends.grpc.codec import code_of, guarded, status
from broker.frontends.grpc.consume import ConsumeCalls
from broker.frontends.grpc.handles import HandleSigner
from broker.frontends.grpc.owngroup import OwnGroup
from broker.frontends.grpc.pull import PullCalls
from broker.frontends.grpc.route import assignment_endpoints, route_queues
from broker.frontends.grpc.sends import SEND_TIMEOUT_S, SendCalls
from broker.frontends.grpc.txn import GatewayTransactions
from client import errors
from client.cluster.routes import Routes
from client.producer.delivery import Delivery
from protocol.tls import TlsConfig

if TYPE_CHECKING:
    from broker.api.broker import Broker

log = logging.getLogger("broker.grpc")

Address = tuple[str, int]
ACCEPTED_TYPES = (pb.MessageType.NORMAL, pb.MessageType.FIFO, pb.MessageType.DELAY,
                  pb.MessageType.TRANSACTION, pb.MessageType.PRIORITY)
TELEMETRY_QUEUE_MAX = 64  # commands waiting to go out on one client's telemetry stream
GRPC_MESSAGE_BYTES_MAX = 16 << 20
# What a client is told in its settings (RocketMQ proxy's defaults)
SEND_ATTEMPTS_MAX = 3
BACKOFF_INITIAL_MS, BACKOFF_MAX_MS, BACKOFF_MULTIPLIER = 10, 1000, 2.0
RECEIVE_BATCH_SIZE = 32
LONG_POLLING_S = 30


def _certificate_configuration(tls: TlsConfig) -> Any:
    with open(tls.key_file, "rb") as f:
        key = f.read()
    with open(tls.cert_file, "rb") as f:
        chain = f.read()
    return grpc.ssl_server_certificate_configuration([(key, chain)])


def _server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """gRPC's TLS from the broker's --tls-* files (gRPC's own TLS stack, not Python's ssl),
    which follows ``tls.reload()`` (SIGHUP): gRPC asks before each new handshake, and gets the
    files again once they were reloaded (checked by the reload); open connections keep theirs."""
    seen = [tls.reloads]

    def fetch() -> Any:  # (called by gRPC's own threads: reads a counter, rarely the files)
        if tls.reloads == seen[0]:
            return None  # no change
        try:
            fresh = _certificate_configuration(tls)
        except OSError as err:
            log.error("the gRPC listener keeps its certificate: %s", err)
            return None
        seen[0] = tls.reloads
        log.warning("the gRPC listener takes the reloaded certificate %s", tls.cert_file)
        return fresh

    return grpc.dynamic_ssl_server_credentials(_certificate_configuration(tls), fetch,
                                               require_client_authentication=False)


def server_options() -> list[tuple[str, int]]:
    """The ``grpc.aio`` server's options (the benchmark's no-op server uses them too)."""
    return [("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES_MAX),
            ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES_MAX),
            ("grpc.so_reuseport", 0)]


def _metadata(context: Any, name: str) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == name:
            return str(value)
    return ""


class GrpcGateway(ConsumeCalls, PullCalls, SendCalls,
                  sg.MessagingServiceServicer):  # type: ignore[misc]
    """One broker node's gRPC endpoint (see the module docstring)."""

    def __init__(self, server: Broker, listen: Address) -> None:
        self.server = server
        self.listen = listen
        self.group = server.config.node.group
        self.max_body_bytes = server.config.max_message_bytes
        self.max_delay_ms = server.config.max_delay_ms
        if server.config.cluster_key is None:  # (BrokerConfig refuses that first)
            raise ValueError("the gRPC endpoint signs its handles with the cluster credential")
        self.handles = HandleSigner(server.config.cluster_key)
        tls = server.config.node.tls
        self.tls = tls
        self.routes = Routes(list(server.config.namesrv),  # its calls into the cluster: TLS too
                             ssl_context=tls.dial_context() if tls is not None else None,
                             from_env=False)
        self.delivery = Delivery(self.routes)  # (other groups' queues)
        self.own = OwnGroup(server, self.routes, self._ensure_routes,  # this group's queues
                            SEND_TIMEOUT_S)
        self.other_groups: dict[str, LeaderForward] = {}  # (--acl: signed, per account)
        acl = server.config.acl
        self.access = AccessInterceptor(secret_reader(server.acl),
                                        server.config.acl_replay_window_ms) if acl else None
        self._grpc: aio.Server | None = None
        self._routes_once = RoutesOnce(self.routes)
        self._round_robin: dict[str, itertools.count[int]] = {}
        self.sessions: dict[str, asyncio.Queue[Any]] = {}  # client id -> its telemetry outbox
        self.calls = 0
        self.address: Address | None = None
        self.max_delivery_attempts = server.config.grpc_max_delivery_attempts
        self.accepted_types = ACCEPTED_TYPES
        self.endpoints_of = functools.partial(assignment_endpoints,  # (QueryAssignment's)
                                              own_node=server.config.node.node_id)
        self.txns = GatewayTransactions(self.routes, f"grpc-gateway-{self.group}-"
                                        f"{server.config.node.node_id}", self.sessions,
                                        self._ensure_routes, txn_signing(
                                            server.acl, list(server.config.namesrv),
                                            self.routes.ssl_context) if acl else None)

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> Address:
        self._grpc = aio.server(options=server_options(),
                                interceptors=[self.access] if self.access is not None else None)
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
        await self.own.close()
        for forward in self.other_groups.values():
            await forward.close()
        if self._grpc is not None:
            await self._grpc.stop(grace=0.5)
            self._grpc = None
        for outbox in self.sessions.values():
            outbox.put_nowait(None)
        self.sessions.clear()
        await self._routes_once.close()

    async def _ensure_routes(self) -> None:
        await self._routes_once.ensure()

    def status(self) -> dict[str, Any]:
        """The endpoint's counts (the node's status shows them): gRPC calls; those for this
        group's queues (served through the broker API); the SEND_RUNS requests their messages
        were gathered into; the API's requests forwarded to the leader (none on the leader);
        the calls refused for their signature (``--acl``)."""
        gathers = (self.own.gather, *self.own.gathers.values())
        return {"calls": self.calls, "own_group_calls": self.own.calls,
                "send_requests": sum(g.requests for g in gathers),
                "forwarded": self.own.api.forwarded,
                "sessions": len(self.sessions),
                "unauthorized": self.access.refused if self.access is not None else 0}

    # -- routes -------------------------------------------------------------------------------------

    @guarded(sv.QueryRouteResponse)
    async def QueryRoute(self, request: Any, context: Any) -> Any:
        topic = request.topic.name
        try:
            route = await self._fresh_route(topic)
        except errors.ClientError as err:
            return sv.QueryRouteResponse(status=status(code_of(err), str(err)))
        queues = route_queues(request.topic, route, self.accepted_types,
                              _metadata(context, "x-mq-language"))
        if not queues:
            return sv.QueryRouteResponse(status=status(
                pb.Code.TOPIC_NOT_FOUND if not route.groups else pb.Code.HA_NOT_AVAILABLE,
                f"no group serves {topic!r} over gRPC"))
        return sv.QueryRouteResponse(status=status(), message_queues=queues)

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
        account = ACTING.get()  # (with --acl: the account the stream was opened as)
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
                            t.name for t in cmd.settings.publishing.topics), account)
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
            s.backoff_policy.max_attempts = self.server.state.subscription_groups \
                .max_delivery_attempts(theirs.subscription.group.name, self.max_delivery_attempts)
            s.subscription.receive_batch_size = RECEIVE_BATCH_SIZE
            s.subscription.long_polling_timeout.seconds = LONG_POLLING_S
        backoff = s.backoff_policy.exponential_backoff
        backoff.initial.FromMilliseconds(BACKOFF_INITIAL_MS)
        backoff.max.FromMilliseconds(BACKOFF_MAX_MS)
        backoff.multiplier = BACKOFF_MULTIPLIER
        s.metric.on = False
        return s

    # -- not served yet: a protocol status, never a hang -----------------------------------------

    async def SyncLiteSubscription(self, request: Any, context: Any) -> Any:
        return sv.SyncLiteSubscriptionResponse(status=_not_yet("SyncLiteSubscription"))


def _not_yet(rpc: str) -> Any:
    return status(pb.Code.NOT_IMPLEMENTED, f"{rpc} is not supported by this endpoint")

