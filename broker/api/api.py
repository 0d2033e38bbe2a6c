"""The in-process broker API that every front end calls (``BrokerApi``): any request of the
broker's kinds (sends, pulls, pop/ack/change-invisible, offsets, queue locks, transactions,
queries, admin), its every field checked by the request table (``broker.api.table``) or the
send path, served by this node's broker.

A request this node must not serve (a write, or a read that needs the leader) raises
NotLeaderError before it does anything; a front end whose clients do not follow redirects
(RocketMQ's) gives a ``forward``, and the API then sends the request once to the group's leader
(``forward`` follows the NOT_LEADER hints within the deadline it is given: ``timeout_s``, which
only a forwarded request has; one served here ends on its own, as the send path's and the
handlers' waits do). Our own protocol's clients follow redirects themselves: its front end
gives none, and the client gets the refusal with the leader's name.

With access control on (``--acl``), a front end says whom it serves: the access key it
authenticated, set for the request's task with ``acting_as`` (its own steps, such as finding the
message a client's request names, ``acting_as(NODE_ITSELF)``). Every call is then judged by
that account's permissions (``AclService.permit``; no account: SignatureError), and a forward is
signed as that account (the node knows its secret from the replicated ACL): the leader judges it
again. A front end that sets no account is refused, never let through.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any

from broker.api.broker import Broker
from broker.api.table import TABLE
from broker.core.requests import dispatch
from protocol.auth import Credentials
from protocol.broker_errors import BadEntryError
from protocol.broker_kinds import SEND, SEND_RUNS
from protocol.envelope import Request
from protocol.errors import NotLeaderError

__all__ = ["FORWARD_TIMEOUT_S", "NODE_ITSELF", "BrokerApi", "Forward", "acting_as"]

# (kind, arguments, deadline in seconds, credentials to sign with or None) -> the leader's answer
Forward = Callable[[int, list[Any], float, Credentials | None], Awaitable[Any]]
FORWARD_TIMEOUT_S = 3.0  # a forwarded request's deadline unless the caller gives one
NODE_ITSELF = "\x00node"  # acting as the node itself: a front end's own step (never a key)
ACTING: ContextVar[str | None] = ContextVar("acting_account", default=None)


@contextlib.contextmanager
def acting_as(access_key: str | None) -> Iterator[None]:
    """The account the API judges this task's calls by, while the block runs."""
    token = ACTING.set(access_key)
    try:
        yield
    finally:
        ACTING.reset(token)


class BrokerApi:
    def __init__(self, broker: Broker, forward: Forward | None = None) -> None:
        self.broker = broker
        self.forward = forward
        self.forwarded = 0  # requests this node sent on to its leader

    async def call(self, kind: int, *args: Any, connection: Any = None,
                   timeout_s: float = FORWARD_TIMEOUT_S) -> Any:
        """One request of the broker's kinds: its answer, as our protocol's would be."""
        acl = self.broker.acl
        acting = ACTING.get()
        try:
            if acl.enabled and acting != NODE_ITSELF:
                acl.permit(acting, kind, list(args))
            return await self.local(kind, list(args), connection)
        except NotLeaderError:
            if self.forward is None:
                raise
            credentials = None
            if acl.enabled:
                if acting is None or acting == NODE_ITSELF:
                    raise  # (nobody to sign as: the client retries, at the leader)
                credentials = acl.credentials(acting)
        self.forwarded += 1
        return await self.forward(kind, list(args), timeout_s, credentials)

    async def local(self, kind: int, args: list[Any], connection: Any = None) -> Any:
        """The request served by this node alone (NotLeaderError where it must not)."""
        if kind == SEND_RUNS:
            return await self.broker.sends.send_runs(args)
        if kind == SEND:
            if len(args) not in (3, 4):
                raise BadEntryError("SEND takes a topic, a queue id, messages and optionally "
                                    "the queue count of a topic it creates")
            return await self.broker.sends.send(args[0], args[1], args[2], args[3:])
        return await dispatch(TABLE, self.broker, Request(kind, 0, args), connection)

    async def send_runs(self, runs: list[list[Any]],
                        timeout_s: float = FORWARD_TIMEOUT_S) -> list[Any]:
        """SEND_RUNS: ``[[topic, queue id, [message...]]...]``, one answer per run (a stored run's
        ``[SEND_OK, ...]`` or a refused one's ``[code, detail]``)."""
        answer: list[Any] = await self.call(SEND_RUNS, runs, timeout_s=timeout_s)
        return answer
