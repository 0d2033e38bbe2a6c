"""What the remoting endpoint's request handlers see of it (``RemotingHost``) and of the
connection a request came on (``ClientConnection``), and the handlers' type: narrow protocols, so
that the handler modules do not import the server that imports them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from protocol.remoting.command import Command

if TYPE_CHECKING:
    import asyncio

    from broker.api.broker import Broker

__all__ = ["ClientConnection", "Handler", "RemotingHost"]

Address = tuple[str, int]


class RemotingHost(Protocol):
    broker: Broker
    store_host: Address  # this node's registered remoting address (in the message ids)

    async def call(self, kind: int, *args: Any, connection: Any = None) -> Any: ...

    def consumers_changed(self, group: str, joined: object = None) -> None: ...

    def gathered_send(self, topic: str, queue_id: int, row: list[Any],
                      queues_asked: int | None = None) -> asyncio.Future[list[Any]]: ...


class ClientConnection(Protocol):
    consumers: set[tuple[str, str]]  # (client id, group) that heartbeat on it
    listed_unjoined: set[str]  # groups it asked the members of before it joined them
    # (group, topic) -> (expression, its type: TAG or SQL92), from the consumers' heartbeats
    subscriptions: dict[tuple[str, str], tuple[str, str]]


Handler = Callable[[RemotingHost, ClientConnection, Command], Awaitable[Command | None]]
