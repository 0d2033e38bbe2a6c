"""A stream on the peer port: an inbound peer connection that opened with ``SnapshotHello`` rather
than ``Hello`` is handed over as a ``PeerStream``, a two-way channel of whole payloads for a
protocol of its own (the snapshot stream of ``dledger.snapshots.receive``), so that a snapshot
travels the same route as the group's Raft traffic (and through the same fault proxies).

Owns the bounded hand-over: payloads wait in a queue of at most ``QUEUE_MAX``; past that the
socket stops being read (TCP pushes back on the sender) until the consumer catches up. So a
stream holds at most a few frames in memory whatever the sender does. Must not interpret
payloads.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

from protocol.errors import WireError

__all__ = ["QUEUE_MAX", "PeerStream", "StreamClosedError"]

QUEUE_MAX = 4  # payloads waiting for the consumer before the socket is no longer read


class StreamClosedError(WireError):
    """The stream's connection closed (or was closed) before the payload waited for came."""


class _Transport(Protocol):
    def write(self, data: bytes) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def abort(self) -> None: ...

    def close(self) -> None: ...

    def is_closing(self) -> bool: ...


class PeerStream:
    """The consumer's side of one handed-over connection (see the module docstring)."""

    def __init__(self, transport: _Transport, peer: str) -> None:
        self.peer = peer
        self._transport = transport
        self._queue: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._closed = False

    # -- the connection's side ---------------------------------------------------------------

    def feed(self, payload: bytes) -> None:
        self._queue.append(payload)
        if len(self._queue) >= QUEUE_MAX and not self._paused:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def connection_lost(self) -> None:
        self._closed = True
        self._wake()

    # -- the consumer's side -----------------------------------------------------------------

    async def get(self, timeout_s: float) -> bytes:
        """The next payload; ``StreamClosedError`` if the connection closes first, TimeoutError
        if none comes within ``timeout_s``."""
        async with asyncio.timeout(timeout_s):
            while not self._queue:
                if self._closed:
                    raise StreamClosedError(f"stream from {self.peer} closed")
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
        payload = self._queue.popleft()
        if self._paused and len(self._queue) < QUEUE_MAX // 2 and not self._closed:
            self._paused = False
            self._transport.resume_reading()
        return payload

    def write(self, frame: bytes) -> None:
        if not self._closed and not self._transport.is_closing():
            self._transport.write(frame)

    def close(self, flush: bool = False) -> None:
        """Close the connection: at once, or once what was written has gone (``flush``)."""
        self._closed = True
        if flush:
            self._transport.close()
        else:
            self._transport.abort()
        self._wake()

    @property
    def closed(self) -> bool:
        return self._closed

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
