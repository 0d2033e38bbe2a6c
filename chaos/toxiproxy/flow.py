"""The plumbing of one direction of a proxied connection: chunks, inboxes, reader and writer.

Owns the hand-off between pipeline stages (docs/toxiproxy.md): a chunk is a piece of data
stamped with its arrival time, or the end-of-stream marker; each stage has a bounded ``Inbox``;
an ``Emitter`` looks its target up again every time it waits, so a stage can be inserted or
removed while data flows. The ``Reader`` turns a socket into chunks (at most 32 KiB) and the
``Writer`` turns chunks back into writes and fully closes its socket at end-of-stream (no
half-close). Nothing here knows about toxics or the HTTP API.

Waits inside a connection have no deadline of their own, on purpose: a proxied connection may be
idle or back-pressured for as long as its peers like (as through a real Toxiproxy). Each such wait
ends when data moves or when the connection's teardown cancels the task.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Callable

READ_CHUNK_BYTES = 32 * 1024

log = logging.getLogger(__name__)


def now_s() -> float:
    return asyncio.get_running_loop().time()


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Bytes read from a socket (``data``) or end-of-stream (``data is None``)."""

    data: bytes | None
    stamp_s: float

    @property
    def eof(self) -> bool:
        return self.data is None


class Inbox:
    """A FIFO of chunks with a soft capacity and a change signal for waiters.

    ``push`` may exceed the capacity: that only happens when a removed or restarted stage hands
    over what it was holding, and the backpressure of ``Emitter.emit`` then restores the bound.
    """

    def __init__(self, capacity: int) -> None:
        assert capacity >= 1
        self.capacity = capacity
        self.items: collections.deque[Chunk] = collections.deque()
        self._waiters: list[asyncio.Future[None]] = []

    def has_space(self) -> bool:
        return len(self.items) < self.capacity

    def push(self, chunk: Chunk) -> None:
        self.items.append(chunk)
        self.notify()

    def push_front(self, chunk: Chunk) -> None:
        self.items.appendleft(chunk)
        self.notify()

    def pop(self) -> Chunk:
        chunk = self.items.popleft()
        self.notify()
        return chunk

    def notify(self) -> None:
        """Wake every waiter; each re-checks its own condition."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def changed(self, timeout_s: float | None = None) -> bool:
        """Wait until the inbox changes; False if ``timeout_s`` passed first."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
            return True
        except TimeoutError:
            return False
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)


class Receiver:
    """Anything a chunk can be handed to: a stage or the writer."""

    inbox: Inbox


class Emitter:
    """Something that hands chunks to ``next``; ``next`` may be rewired at any time."""

    next: Receiver

    async def emit(self, chunk: Chunk) -> None:
        # Backpressure: wait for space in whatever the target is *now*. A rewire notifies the
        # old target's inbox, so a waiter here wakes up and retries against the new one.
        while True:
            inbox = self.next.inbox
            if inbox.has_space():
                inbox.push(chunk)
                return
            await inbox.changed()


class Reader(Emitter):
    """Reads the source socket into stamped chunks; EOF or a read error ends the stream."""

    def __init__(self, source: asyncio.StreamReader) -> None:
        self.source = source

    async def run(self) -> None:
        while True:
            try:
                data = await self.source.read(READ_CHUNK_BYTES)
            except OSError as exc:  # includes ConnectionResetError: the stream simply ends
                log.debug("read ended: %s", exc)
                data = b""
            if not data:
                await self.emit(Chunk(None, now_s()))
                return
            await self.emit(Chunk(data, now_s()))


class Writer(Receiver):
    """Writes chunks to the destination; end-of-stream closes it (then input is discarded)."""

    def __init__(self, dest: asyncio.StreamWriter, on_closed: Callable[[], None]) -> None:
        self.inbox = Inbox(1)
        self.dest = dest
        self.closed = False
        self._on_closed = on_closed

    async def run(self) -> None:
        while True:
            while not self.inbox.items:
                await self.inbox.changed()
            chunk = self.inbox.pop()
            if self.closed:
                continue  # the connection is being torn down; nothing more can be delivered
            if chunk.data is None:  # end of stream
                self.close()
                continue
            try:
                self.dest.write(chunk.data)
                await self.dest.drain()
            except OSError as exc:
                log.debug("write failed: %s", exc)
                self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.dest.close()
            self._on_closed()


__all__ = [
    "READ_CHUNK_BYTES",
    "Chunk",
    "Emitter",
    "Inbox",
    "Reader",
    "Receiver",
    "Writer",
    "now_s",
]
