"""A broker node's process shell (``BrokerServer``): one broker (``broker.api.broker.Broker``: the
log node, the state machine and the features' services) and what it is reached by: our
protocol's client port (``broker.frontends.native``), RocketMQ 5's gRPC endpoint when asked
(``broker.frontends.grpc``), the admin HTTP endpoints, Prometheus metrics and registration with
the NameServers (``broker.shell``). Owns starting and stopping them in order, and the node's
status as the admin endpoints and BROKER_STATUS show it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from broker.api.broker import Broker
from broker.api.table import SERVED_KINDS
from broker.config import BrokerConfig
from broker.frontends.native.server import NativeFrontend
from broker.machine.state import BrokerState
from broker.shell.checkpoint import Checkpoints
from broker.shell.http import make_routes
from broker.shell.http_server import HttpServer
from broker.shell.metrics import BrokerMetrics
from broker.shell.registrar import Registrar
from dledger.node.config import Address
from dledger.node.runtime import Node
from dledger.server import status_dict
from protocol.framed import ConnectionLimits

__all__ = ["BrokerServer"]

log = logging.getLogger("broker.server")

OFFSET_GROUPS_SHOWN_BYTES = 16 << 10  # consumer groups with committed offsets named in the
#                                      status: the first names, as JSON, within this budget
#                                      (the status stays far under a reader's 256 KiB bound)


class BrokerServer:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.group = config.node.group
        self.broker = Broker(config, SERVED_KINDS)
        self.broker.status_of = self.status  # (BROKER_STATUS answers the whole node's status)
        self.limits = ConnectionLimits(config.max_connections, config.input_buffer_bytes_max)
        self.native = NativeFrontend(self.broker, config.client_listen, self.limits)
        self.registrar = Registrar(self, list(config.namesrv), config.register_interval_s)
        self.metrics = BrokerMetrics(self)
        self.broker.metrics = self.metrics
        self.native.refusals = self.metrics
        self.client_address: Address | None = None
        self.admin_address: Address | None = None
        self.grpc_address: Address | None = None  # where RocketMQ 5 clients are served
        self._gateway: Any = None  # a GrpcGateway (imported only when asked for: grpcio)
        self.remoting_address: Address | None = None  # where RocketMQ 4.x clients are served
        self._remoting: Any = None  # a RemotingServer (broker.frontends.remoting)
        self._admin: HttpServer | None = None

    # The broker's parts the shell's modules read (registrar, metrics, admin endpoints).
    @property
    def state(self) -> BrokerState:
        return self.broker.state

    @property
    def node(self) -> Node:
        return self.broker.node

    @property
    def checkpoints(self) -> Checkpoints:
        return self.broker.checkpoints

    def caught_up(self) -> bool:
        return self.broker.caught_up()

    async def start(self) -> None:
        await self.broker.node.start()
        self.metrics.attach()
        self.client_address = await self.native.start()
        tls = self.config.node.tls  # (protocol.tls) on the client, admin and gRPC listeners too
        if self.config.admin_listen is not None:
            self._admin = HttpServer(make_routes(self, self.config.cluster_key
                                                 if self.config.protect_status else None))
            self.admin_address = await self._admin.start(
                *self.config.admin_listen, ssl_context=tls.server_context() if tls else None)
        if self.config.grpc_listen is not None:
            from broker.frontends.grpc.gateway import GrpcGateway
            self._gateway = GrpcGateway(self.broker, self.config.grpc_listen)
            self.grpc_address = self.config.registered("grpc", await self._gateway.start())
        if self.config.remoting_listen is not None:
            from broker.frontends.remoting.server import RemotingServer
            self._remoting = RemotingServer(self.broker, self.config.remoting_listen)
            bound = await self._remoting.start()
            self.remoting_address = self.config.registered("remoting", bound)
            self._remoting.store_host = self.remoting_address
        if self.config.namesrv:
            self.registrar.start()
        await self.broker.start_services()

    async def stop(self) -> None:
        await self.broker.stop_services()
        if self.config.namesrv:
            await self.registrar.stop()
        if self._gateway is not None:
            await self._gateway.stop()
        if self._remoting is not None:
            await self._remoting.stop()
        if self._admin is not None:
            await self._admin.close()
        self.native.close()
        await self.broker.close()

    def status(self) -> dict[str, Any]:
        broker, state = self.broker, self.broker.state
        st = status_dict(broker.node, self.client_address)
        st["topics"] = {t.name: {"read_queues": t.read_queues, "write_queues": t.write_queues,
                                 "perm": t.perm} for t in state.topics.values()}
        st["applied_index"] = state.applied_index
        st["caught_up"] = broker.caught_up()  # what /readyz answers: its state is the group's
        st["admin_address"] = list(self.admin_address or ())
        now = time.monotonic()
        st["consumer_groups"] = broker.members.snapshot(now)
        st["offset_groups"] = _shown(sorted({k[0] for k in state.offsets}))
        st["topic_consumer_groups"] = _topic_groups(broker.members.topic_groups(now),
                                                    state.offsets)
        st["client_connections"] = self.limits.stats()
        st["timers"] = broker.delays.status()
        st["retries"] = broker.retries.status()
        st["transactions"] = broker.txns.status()
        st["pop"] = broker.pops.status()
        st["expired_passed"] = dict(broker.expired_passed)  # by path (protocol.message_ttl)
        st["key_index"] = broker.index.status()
        if self._gateway is not None:
            st["grpc"] = self._gateway.status()
        if self._remoting is not None:
            st["remoting"] = self._remoting.status()
        st["snapshot"] = {**broker.node.snapshot_status(),
                          "checkpoint_index": broker.checkpoints.checkpointed_index}
        return st


def _shown(names: list[str], size: Callable[[str], int] = lambda n: len(json.dumps(n))
           ) -> list[str]:
    """The first of ``names`` whose JSON (``size`` each) fits ``OFFSET_GROUPS_SHOWN_BYTES``."""
    out, used = [], 0
    for name in names:
        used += size(name) + 1
        if used > OFFSET_GROUPS_SHOWN_BYTES:
            break
        out.append(name)
    return out


def _topic_groups(live: dict[str, set[str]],
                  offsets: Iterable[tuple[str, str, int]]) -> dict[str, list[str]]:
    """Topic -> the consumer groups that consume it: a live member subscribes to it, or the
    group committed an offset on it (RocketMQ's queryTopicConsumeByWho); the first topics by
    name whose JSON fits ``OFFSET_GROUPS_SHOWN_BYTES``."""
    by_topic = live
    for group, topic, _ in offsets:
        by_topic.setdefault(topic, set()).add(group)
    rows = {topic: sorted(groups) for topic, groups in by_topic.items()}
    return {topic: rows[topic]
            for topic in _shown(sorted(rows), lambda t: len(json.dumps([t, rows[t]])))}
