"""The consumers a node can ask something on their own connection: each front end whose
connections can carry a server-initiated request registers a consumer's connection at its
heartbeat (``ConsumerConnection``); the table is a ``broker.core.clients.ClientGroups``, per node
and in memory, as RocketMQ's consumer table is (a consumer heartbeats every node of its topics'
groups; a closed connection's consumers are dropped at once, a silent one expires).

The same table's twin keeps the connections a consumer can be *told* on (``NoticeChannel``: our
own protocol's): when a group's members or their subscriptions change on this node
(``broker.core.members``), its other members are sent a notice at once (RocketMQ's
NOTIFY_CONSUMER_IDS_CHANGED; ``protocol.broker_kinds.CONSUMER_IDS_CHANGED``), so that they
heartbeat and rebalance now instead of at their next heartbeat.

Nothing here is replicated: the answers are the consumer's, about itself, and re-consuming one
message changes no offset (RocketMQ's rule: the message is handed to the listener outside its
queue; the consumer's progress and the group's offsets stay as they were).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol, runtime_checkable

from broker.core.clients import ClientGroups
from protocol.broker_errors import ClientNoAnswerError, ClientNotConnectedError

__all__ = ["ASK_TIMEOUT_S", "ConsumerConnection", "ConsumerConnections", "NoticeChannel"]

ASK_TIMEOUT_S = 10.0  # a consumer's answer (its listener may take a while over one message)


@runtime_checkable
class ConsumerConnection(Protocol):
    """A consumer's connection as an operator's question sees it (a front end's connection)."""

    @property
    def alive(self) -> bool: ...

    async def running_info(self, group: str, client_id: str) -> dict[str, Any]:
        """The consumer's own account of itself."""
        ...

    async def consume_directly(self, group: str, client_id: str,
                               found: list[Any]) -> dict[str, Any]:
        """The consumer consumes ``found`` (a VIEW_MESSAGE answer) once more; its result."""
        ...


@runtime_checkable
class NoticeChannel(Protocol):
    """A consumer's connection that carries the broker's notices (a front end's connection)."""

    @property
    def alive(self) -> bool: ...

    def consumer_ids_changed(self, group: str) -> None:
        """Tell the consumer that ``group``'s members (or their subscriptions) changed."""
        ...


class ConsumerConnections:
    def __init__(self) -> None:
        self.table: ClientGroups[ConsumerConnection] = ClientGroups()
        self.told: ClientGroups[NoticeChannel] = ClientGroups()
        self.asked = 0  # questions put to consumers (for status)

    def heartbeat(self, client_id: str, group: str, conn: object, ttl_s: float) -> None:
        """A consumer's heartbeat on ``conn``: kept if the connection can be asked or told."""
        if isinstance(conn, ConsumerConnection):
            self.table.heartbeat(client_id, group, conn, ttl_s, time.monotonic())
        if isinstance(conn, NoticeChannel):
            self.told.heartbeat(client_id, group, conn, ttl_s, time.monotonic())

    def drop(self, conn: object) -> None:
        self.table.drop(conn)  # type: ignore[arg-type]
        self.told.drop(conn)  # type: ignore[arg-type]

    def members_changed(self, group: str, by: str) -> None:
        """A notice to each member of ``group`` that can be told, but ``by`` (whose heartbeat
        made the change: its answer tells it)."""
        for member in self.told.live(group, time.monotonic()):
            if member.client_id != by and member.conn.alive:
                member.conn.consumer_ids_changed(group)

    def connection(self, group: str, client_id: str, node: str) -> ConsumerConnection:
        found = self.table.find(group, client_id, time.monotonic())
        if found is None or not found.conn.alive:
            raise ClientNotConnectedError(
                f"consumer {client_id!r} of group {group!r} does not heartbeat on node {node} "
                "through a protocol the broker can ask (RocketMQ 4.x remoting)")
        return found.conn

    async def ask(self, what: str, client_id: str, question: Any) -> dict[str, Any]:
        """The consumer's answer to ``question`` (an awaitable), within ASK_TIMEOUT_S."""
        self.asked += 1
        try:
            answer: dict[str, Any] = await asyncio.wait_for(question, ASK_TIMEOUT_S)
        except TimeoutError:
            raise ClientNoAnswerError(f"consumer {client_id!r} did not answer {what} in "
                                      f"{ASK_TIMEOUT_S:.0f} s") from None
        return answer
