"""One toxic running on one link: the ``Stage`` between two neighbours of the pipeline.

Owns the per-(link, toxic) run state: the inbox, the chunk currently ``held`` (taken from the
inbox but not yet fully passed on), the per-link ``state`` that survives restarts (limit_data's
byte count), the toxicity draw, and the stop/restart protocol used for live updates and removal
(docs/toxiproxy.md). The behaviour of each toxic type lives in ``behaviours``; the wiring of
stages into a link lives in ``link``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, overload

from chaos.toxiproxy.errors import ToxiproxyError
from chaos.toxiproxy.flow import Chunk, Emitter, Inbox, Receiver
from chaos.toxiproxy.toxics import ToxicSpec


class Resettable(Protocol):
    def reset(self) -> None:
        """Reset the proxied connection (both sides see RST)."""


class StageLink(Protocol):
    """What a stage knows of its link (``chaos.toxiproxy.link.Link``): its connection."""

    @property
    def connection(self) -> Resettable: ...


# What a stage runs: the toxic's behaviour (``chaos.toxiproxy.behaviours``) over the stage.
Behaviour = Callable[["Stage"], Awaitable[None]]

LATENCY_INBOX_CHUNKS = 1024
STAGE_STOP_TIMEOUT_S = 5.0


class StageStuckError(ToxiproxyError):
    """A stage did not stop within ``STAGE_STOP_TIMEOUT_S`` after being cancelled."""


class Stage(Emitter, Receiver):
    """A toxic on one link: takes chunks from its inbox, emits them to ``next``."""

    def __init__(self, spec: ToxicSpec, link: StageLink, rng: random.Random,
                 behaviour: Behaviour, passthrough: Behaviour) -> None:
        capacity = LATENCY_INBOX_CHUNKS if spec.type == "latency" else 1
        self.inbox = Inbox(capacity)
        self.spec = spec
        self.link = link
        self._behaviour, self._passthrough = behaviour, passthrough
        self.rng = rng
        self.held: Chunk | None = None
        self.state: dict[str, Any] = {}
        self.task: asyncio.Task[None] | None = None
        self.active = self._draw_toxicity()

    def _draw_toxicity(self) -> bool:
        """Whether the real toxic runs on this link (drawn once per start, docs/toxiproxy.md)."""
        toxicity = self.spec.toxicity
        if toxicity >= 1.0:
            return True
        return toxicity > 0.0 and self.rng.random() < toxicity

    def start(self, spawn: Callable[[Awaitable[None]], asyncio.Task[None]]) -> None:
        self.task = spawn(self._run())

    async def _run(self) -> None:
        await (self._behaviour if self.active else self._passthrough)(self)
        # The toxic ended the stream (or passed the real end on): the connection is going down,
        # so keep consuming to never block the stages before this one.
        while True:
            await self.take()
            self.held = None

    async def stop(self) -> None:
        """Cancel the running behaviour; ``held`` keeps what it had not passed on."""
        task = self.task
        if task is None or task.done():
            return
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=STAGE_STOP_TIMEOUT_S)
        if not done:
            raise StageStuckError(f"toxic {self.spec.name} did not stop")

    def restart(self, spec: ToxicSpec,
                spawn: Callable[[Awaitable[None]], asyncio.Task[None]]) -> None:
        """After ``stop``: release held data at once (a held end-of-stream waits again)."""
        held, self.held = self.held, None
        if held is not None and held.eof:
            self.inbox.push_front(held)
        elif held is not None:
            self.next.inbox.push(held)
        self.spec = spec
        self.active = self._draw_toxicity()
        self.start(spawn)

    def hand_over(self) -> None:
        """After ``stop``, on removal: everything held or queued goes to ``next``, in order."""
        target = self.next.inbox
        if self.held is not None:
            target.push(self.held)
            self.held = None
        while self.inbox.items:
            target.push(self.inbox.items.popleft())
        self.inbox.notify()  # an emitter still waiting on this inbox re-targets

    # --- the API the behaviours use -----------------------------------------------------------

    @overload
    async def take(self, timeout_s: None = None) -> Chunk: ...

    @overload
    async def take(self, timeout_s: float | None) -> Chunk | None: ...

    async def take(self, timeout_s: float | None = None) -> Chunk | None:
        """The next chunk (now ``held``), or None if ``timeout_s`` passed with nothing."""
        loop = asyncio.get_running_loop()
        deadline_s = None if timeout_s is None else loop.time() + timeout_s
        while not self.inbox.items:
            remaining_s = None if deadline_s is None else deadline_s - loop.time()
            if remaining_s is not None and remaining_s <= 0:
                return None
            await self.inbox.changed(remaining_s)
        self.held = self.inbox.pop()
        return self.held

    async def forward(self, chunk: Chunk) -> None:
        """Pass ``chunk`` on; the held chunk is then done with."""
        await self.emit(chunk)
        self.held = None

    async def forward_piece(self, piece: bytes, rest: bytes, stamp_s: float) -> None:
        """Pass on the first piece of the held chunk; ``rest`` stays held."""
        await self.emit(Chunk(piece, stamp_s))
        self.held = Chunk(rest, stamp_s) if rest else None

    def drop(self) -> None:
        self.held = None

    @property
    def attributes(self) -> dict[str, int]:
        return self.spec.attributes


__all__ = ["LATENCY_INBOX_CHUNKS", "Stage", "StageStuckError"]
