"""The node's own broker group at the gRPC endpoint (``broker.frontends.grpc.gateway``): every
call for a queue of this node's group goes through the in-process broker API
(``broker.api.api.BrokerApi``). On the group's leader it is served in this process: a send goes
into the send path (every field checked, grouped with the other sends of its event-loop turn
into one log entry), any other request through the request table. On a follower the API sends it
once to the leader (``broker.frontends.forward``).

Owns which queue of the group a message goes to (the topic's write queues as this node's state
knows them, else as the NameServers' route says, else the broker's default for a topic its
first send creates) and the API's named errors as the protocol's codes (``codec.code_of``).
Other groups' queues are not its business (the gateway sends those through the client
library).
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from rocketmq.grpc_protocol import definition_pb2 as pb

from broker.api.api import FORWARD_TIMEOUT_S, BrokerApi
from broker.frontends.forward import LeaderForward
from broker.frontends.gather import SendGather
from broker.frontends.grpc.codec import GatewayError, code_of, status_code
from client import errors
from client.cluster.routes import Routes
from protocol.broker_errors import BrokerError
from protocol.errors import DLedgerError

if TYPE_CHECKING:
    from broker.api.broker import Broker

__all__ = ["OwnGroup"]

SEND_OK = "SEND_OK"
API_ERRORS = (BrokerError, DLedgerError, errors.ClientError)


class OwnGroup:
    def __init__(self, broker: Broker, routes: Routes,
                 ensure_routes: Callable[[], Awaitable[None]],
                 send_timeout_s: float = FORWARD_TIMEOUT_S) -> None:
        self.broker = broker
        self.group = broker.group
        self.routes = routes
        self.ensure_routes = ensure_routes
        self.api = BrokerApi(broker, forward=LeaderForward(self.group, routes, ensure_routes))
        self.gather = SendGather(self.api.send_runs, send_timeout_s)
        self.calls = 0  # requests of the gRPC clients made to the API (served here or forwarded)
        self._turn = itertools.count()

    async def call(self, kind: int, *args: Any, timeout_s: float = FORWARD_TIMEOUT_S) -> Any:
        """One request of the broker's kinds to the group; a named error as a ``GatewayError``."""
        self.calls += 1
        try:
            return await self.api.call(kind, *args, timeout_s=timeout_s)
        except API_ERRORS as err:
            raise GatewayError(code_of(err), str(err)) from err

    async def send(self, topic: str, queue_id: int, row: list[Any]) -> list[Any]:
        """One message (a send row) to one queue of the group, with the concurrent calls' in
        one request (``broker.frontends.gather``): its run's answer, ``[SEND_OK, queue id,
        [queue offset], [message id], ...]`` (``broker.core.sendwire.run_answers``)."""
        self.calls += 1
        try:
            answer = await self.gather.send(topic, queue_id, row)
        except API_ERRORS as err:
            raise GatewayError(code_of(err), str(err)) from err
        if answer[0] != SEND_OK:
            # a queue this endpoint chose and the group no longer has: the client's retry
            # chooses again; any other refusal is the broker's answer to the message
            code = status_code(answer[0]) if answer[0] != "QUEUE_NOT_FOUND" \
                else int(pb.Code.HA_NOT_AVAILABLE)
            raise GatewayError(code, f"{answer[0]}: {answer[1]}")
        return list(answer)

    async def write_queues(self, topic: str) -> int | None:
        """The number of write queues the group has for ``topic`` (at least 1: a send to a
        topic the group does not let anyone write is refused by the broker, by name), or None
        when the NameServers say other groups serve it and this one does not."""
        cfg = self.broker.state.topics.get(topic)
        if cfg is not None:
            return max(1, cfg.write_queues)
        try:  # not known here (yet): a topic of other groups, or one its first send creates
            await self.ensure_routes()
            route = await self.routes.route(topic)
        except errors.ClientError:  # no NameServer answers: the broker decides (auto-create)
            return self.broker.config.default_queues
        if not route.exists:
            return self.broker.config.default_queues
        own = next((g for g in route.groups if g.group == self.group), None)
        return None if own is None else max(1, own.write_queues)

    def queue_id(self, queues: int, message_group: str) -> int:
        """A message's queue among ``queues``: by its message group's hash (a FIFO group's
        messages stay in one queue, in order), else round robin."""
        if message_group:
            return zlib.crc32(message_group.encode()) % queues
        return next(self._turn) % queues
