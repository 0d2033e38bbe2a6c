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

With access control on, each call is made as the account its gRPC call authenticated
(``broker.frontends.grpc.access`` sets it): the API judges it, and a follower forwards it signed
as that account. Sends travel together only with the same account's (one ``SendGather`` per
account), each judged alone first, so that one refused does not fail the others it would have
travelled with; ``credentials`` gives the account's, to sign a request to another group.
"""

from __future__ import annotations

import functools
import itertools
import zlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from rocketmq.grpc_protocol import definition_pb2 as pb

from broker.api.api import ACTING, FORWARD_TIMEOUT_S, NODE_ITSELF, BrokerApi, acting_as
from broker.frontends.forward import LeaderForward
from broker.frontends.gather import SendGather
from broker.frontends.grpc.codec import GatewayError, code_of, status_code
from client import errors
from client.cluster.routes import Routes
from protocol.auth import Credentials, SignatureError
from protocol.broker_errors import BrokerError
from protocol.broker_kinds import SEND
from protocol.errors import DLedgerError

if TYPE_CHECKING:
    from broker.api.broker import Broker

__all__ = ["SEND_OK", "OwnGroup"]

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
        self.forward = LeaderForward(self.group, routes, ensure_routes)
        self.api = BrokerApi(broker, forward=self.forward)
        self.send_timeout_s = send_timeout_s
        self.gather = SendGather(self.api.send_runs, send_timeout_s)
        self.gathers: dict[str, SendGather] = {}  # with --acl: one per account
        self.calls = 0  # requests of the gRPC clients made to the API (served here or forwarded)
        self._turn = itertools.count()

    async def call(self, kind: int, *args: Any, timeout_s: float = FORWARD_TIMEOUT_S,
                   at_leader: bool = False) -> Any:
        """One request of the broker's kinds to the group; a named error as a ``GatewayError``.
        ``at_leader``: a read a follower could serve, served by the leader all the same (it has
        applied whatever its client was told was stored: read-your-writes)."""
        self.calls += 1
        try:
            if at_leader and not self.broker.node.is_leader:
                self.api.forwarded += 1
                return await self.forward(kind, list(args), timeout_s, self.credentials())
            return await self.api.call(kind, *args, timeout_s=timeout_s)
        except API_ERRORS as err:
            raise GatewayError(code_of(err), str(err)) from err

    async def send(self, topic: str, queue_id: int, row: list[Any]) -> list[Any]:
        """One message (a send row) to one queue of the group, with the concurrent calls' in
        one request (``broker.frontends.gather``): its run's answer, ``[SEND_OK, queue id,
        [queue offset], [message id], ...]`` (``broker.core.sendwire.run_answers``)."""
        self.calls += 1
        try:
            answer = await (self._gather_as(topic, queue_id, row) if self.broker.acl.enabled
                            else self.gather.send(topic, queue_id, row))
        except API_ERRORS as err:
            raise GatewayError(code_of(err), str(err)) from err
        if answer[0] != SEND_OK:
            # a queue this endpoint chose and the group no longer has: the client's retry
            # chooses again; any other refusal is the broker's answer to the message
            code = status_code(answer[0]) if answer[0] != "QUEUE_NOT_FOUND" \
                else int(pb.Code.HA_NOT_AVAILABLE)
            raise GatewayError(code, f"{answer[0]}: {answer[1]}")
        return list(answer)

    def _gather_as(self, topic: str, queue_id: int, row: list[Any]) -> Awaitable[list[Any]]:
        """The send with the same account's concurrent ones (judged alone first)."""
        key = self.account()
        self.broker.acl.permit(key, SEND, [topic, queue_id, [row]], leader_rule=False)
        gather = self.gathers.get(key)
        if gather is None:
            gather = self.gathers[key] = SendGather(functools.partial(self._send_runs_as, key),
                                                    self.send_timeout_s)
        return gather.send(topic, queue_id, row)

    async def _send_runs_as(self, access_key: str, runs: list[list[Any]],
                            timeout_s: float) -> list[Any]:
        with acting_as(access_key):
            return await self.api.send_runs(runs, timeout_s)

    def account(self) -> str:
        """The account this call was authenticated as (with --acl); SignatureError if none."""
        key = ACTING.get()
        if key is None or key == NODE_ITSELF:
            raise SignatureError("access control is on: the call names no account")
        return key

    def credentials(self) -> Credentials | None:
        """The call's account's credentials, to sign a request to another group with (None:
        access control is off)."""
        if not self.broker.acl.enabled:
            return None
        return self.broker.acl.credentials(self.account())

    async def close(self) -> None:
        for gather in (self.gather, *self.gathers.values()):
            await gather.close()
        self.gathers.clear()
        await self.forward.close()

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
