"""A proxied TCP connection: two one-way links and the teardown rules that tie them together.

Owns, per connection, the ``upstream`` link (client -> server) and the ``downstream`` link
(server -> client), each a pipeline reader -> toxic stages -> writer, and the live rewiring of
those pipelines when toxics are added, updated or removed (docs/toxiproxy.md).
Also owns how a connection ends: when either writer closes its socket, the other side's reader
sees EOF and the end travels back through the other link's toxics; once both writers are closed
every task of the connection is cancelled. ``abort`` (disable/delete) and ``reset`` (RST) cut it
at once. It does not accept connections or know about the API.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import struct
from collections.abc import Awaitable, Callable

from chaos.toxiproxy import behaviours
from chaos.toxiproxy.flow import Emitter, Reader, Writer
from chaos.toxiproxy.stage import Behaviour, Stage
from chaos.toxiproxy.toxics import DOWNSTREAM, UPSTREAM, ToxicSpec

log = logging.getLogger(__name__)

CLOSE_FLUSH_GRACE_S = 5.0

Spawn = Callable[[Awaitable[None]], asyncio.Task[None]]


def _behaviours_of(spec: ToxicSpec) -> tuple[Behaviour, Behaviour]:
    """The toxic's behaviour, and the pass-through a stage runs instead when its toxicity draw
    says this link is spared."""
    return behaviours.BEHAVIOURS[spec.type], behaviours.noop


class Link:
    """One direction of a connection: reader -> stages -> writer."""

    def __init__(self, connection: Connection, source: asyncio.StreamReader,
                 dest: asyncio.StreamWriter, specs: list[ToxicSpec], rng: random.Random) -> None:
        self.connection = connection
        self.rng = rng
        self.reader = Reader(source)
        self.writer = Writer(dest, connection.on_writer_closed)
        self.stages: list[Stage] = []
        previous: Emitter = self.reader
        for spec in specs:
            stage = Stage(spec, self, rng, *_behaviours_of(spec))
            previous.next = stage
            previous = stage
            self.stages.append(stage)
        previous.next = self.writer

    def start(self, spawn: Spawn) -> None:
        spawn(self.reader.run())
        spawn(self.writer.run())
        for stage in self.stages:
            stage.start(spawn)

    def _find(self, name: str) -> tuple[int, Stage] | None:
        for index, stage in enumerate(self.stages):
            if stage.spec.name == name:
                return index, stage
        return None

    def add(self, spec: ToxicSpec, spawn: Spawn) -> None:
        """Append a stage just before the writer; it sees every chunk not yet written."""
        last: Emitter = self.stages[-1] if self.stages else self.reader
        stage = Stage(spec, self, self.rng, *_behaviours_of(spec))
        stage.next = self.writer
        last.next = stage
        self.stages.append(stage)
        self.writer.inbox.notify()  # a stage waiting for the writer re-targets to the new one
        stage.start(spawn)

    async def update(self, spec: ToxicSpec, spawn: Spawn) -> None:
        found = self._find(spec.name)
        if found is None:
            return
        stage = found[1]
        await stage.stop()
        stage.restart(spec, spawn)

    async def remove(self, name: str) -> bool:
        """Take the stage out, flushing what it held. Returns whether its toxic was active."""
        found = self._find(name)
        if found is None:
            return False
        _, stage = found
        await stage.stop()
        index = self.stages.index(stage)  # may have moved while stopping
        previous: Emitter = self.stages[index - 1] if index > 0 else self.reader
        previous.next = stage.next
        del self.stages[index]
        stage.hand_over()
        return stage.active


class Connection:
    """A client connection and its upstream connection, joined by two links."""

    def __init__(self, client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 toxics: dict[str, list[ToxicSpec]], rng: random.Random,
                 on_finished: Callable[[Connection], None]) -> None:
        self._writers = (client[1], upstream[1])
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed_writers = 0
        self._on_finished = on_finished
        self.finished = False
        self.links = {
            UPSTREAM: Link(self, client[0], upstream[1], toxics[UPSTREAM], rng),
            DOWNSTREAM: Link(self, upstream[0], client[1], toxics[DOWNSTREAM], rng),
        }

    def start(self) -> None:
        for link in self.links.values():
            link.start(self.spawn)

    def spawn(self, coroutine: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coroutine)
        if self.finished:  # e.g. a stage restarted by an update that raced with the teardown
            task.cancel()
            return task
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("proxy connection task failed", exc_info=task.exception())
            self.abort()

    def on_writer_closed(self) -> None:
        self._closed_writers += 1
        if self._closed_writers >= len(self._writers):
            self._finish()

    def _finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        for task in list(self._tasks):
            task.cancel()
        loop = asyncio.get_running_loop()
        for writer in self._writers:
            writer.close()
            # A peer that never reads must not keep a closing socket forever.
            loop.call_later(CLOSE_FLUSH_GRACE_S, writer.transport.abort)
        self._on_finished(self)

    def close(self) -> None:
        """Ordinary close of both sockets (FIN): both peers read EOF."""
        self._finish()

    def abort(self) -> None:
        """Drop the connection at once (disable/delete): buffered data is lost."""
        for writer in self._writers:
            writer.transport.abort()
        self._finish()

    def reset(self) -> None:
        """Close both sockets with SO_LINGER {on, 0}, so both peers get RST."""
        linger = struct.pack("ii", 1, 0)
        for writer in self._writers:
            sock = writer.transport.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                except OSError as exc:  # already closed by the peer: nothing left to reset
                    log.debug("SO_LINGER failed: %s", exc)
        self.abort()

    def add_toxic(self, spec: ToxicSpec) -> None:
        if not self.finished:
            self.links[spec.direction].add(spec, self.spawn)

    async def update_toxic(self, spec: ToxicSpec) -> None:
        if not self.finished:
            await self.links[spec.direction].update(spec, self.spawn)

    async def remove_toxic(self, spec: ToxicSpec) -> None:
        if self.finished:
            return
        was_active = await self.links[spec.direction].remove(spec.name)
        if was_active and spec.type == "timeout":
            self.close()  # Toxiproxy's timeout cleanup: removal closes the connection


__all__ = ["Connection", "Link"]
