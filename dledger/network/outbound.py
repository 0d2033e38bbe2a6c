"""The outbound half of the peer transport (``dledger.network.transport``): the link towards one
peer (where to dial, the connection, the bounded queue of frames waiting for it), its counters,
and the write-only protocol of a dialed connection (anything the peer sends back is a protocol
error: Raft traffic goes one way on a dialed link). Must not block or interpret messages."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import socket
from typing import cast

__all__ = ["Link", "OutboundProtocol", "PeerStats", "address_text", "set_nodelay"]

logger = logging.getLogger("dledger.network.transport")


@dataclasses.dataclass(slots=True)
class PeerStats:
    sent: int = 0  # frames written to the outbound connection
    dropped: int = 0  # frames dropped: pending queue overflow, write buffer full, unknown dst
    reconnects: int = 0  # successful connects after the first
    received: int = 0  # messages delivered to on_message from inbound connections
    bytes: int = 0  # bytes written to the outbound connection (frame headers included)
    bytes_received: int = 0
    errors: int = 0  # malformed or misrouted inbound frames, refused hellos, oversized sends


class Link:
    """The outbound half towards one peer: where to dial, the connection, the pending frames."""

    __slots__ = ("peer", "addr", "transport", "protocol", "pending", "task", "connects", "stats")

    def __init__(self, peer: str, addr: tuple[str, int], pending_frames_max: int) -> None:
        self.peer = peer
        self.addr = addr
        self.transport: asyncio.Transport | None = None  # set only while usable for writes
        self.protocol: OutboundProtocol | None = None
        self.pending: collections.deque[bytes] = collections.deque(maxlen=pending_frames_max)
        self.task: asyncio.Task[None] | None = None
        self.connects = 0
        self.stats = PeerStats()


def address_text(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class OutboundProtocol(asyncio.Protocol):
    """A dialed connection: we only write. Anything the far end sends is a protocol error."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self._transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop transports are not subclasses
        self._transport = transport
        set_nodelay(transport)

    def data_received(self, data: bytes) -> None:
        self._link.stats.errors += 1
        logger.warning("peer %s wrote %d bytes on a write-only link; closing", self._link.peer,
                       len(data))
        self.abort()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        # Synchronously, so that send() queues instead of writing into a dead transport.
        if self._link.transport is self._transport:
            self._link.transport = None
        if not self.closed.done():
            self.closed.set_result(None)
