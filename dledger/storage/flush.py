"""How a node makes its log durable: the group commit of a Ready (inline for a follower's and
for a lone entry, else awaited while the loop runs) and the leader's background group commit,
whose completion is reported back as (index, term, generation) targets for
``RaftCore.mark_durable``.

Owns the one background fsync in flight and where fsyncs that the loop does not wait for
inline run: through Linux AIO where there is an ``AioFsync`` (the kernel runs them, the loop
watches for their completion: no thread hand-offs, see ``dledger.storage.aiofsync``), else on the
fsync thread. It must not touch the core: the node's loop collects ``take_durable()`` and hands
it to the core between Readies.

``Flusher`` is the file log's (``FileLogStore``); ``StoreFlusher`` serves any other ``LogStore``
(the in-memory one a test gives a node), whose ``sync()`` is all there is: each group commit is
that call, on the loop thread, and a background one is done when asked. Both are ``Flushing``,
what the node uses of a flusher.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable
from typing import Protocol

from dledger.node.stats import NodeStats
from dledger.storage.aiofsync import AioFsync, SpinSync
from dledger.storage.commitlog import FileLogStore, SyncToken
from dledger.storage.seams import LogStore
from protocol.errors import StorageError

log = logging.getLogger("dledger.storage.flush")

Target = tuple[int, int, int]  # (index, term, write generation) made durable

__all__ = ["Flusher", "Flushing", "StoreFlusher", "Target"]


class Flushing(Protocol):
    """What the node uses of a flusher (``Flusher``'s methods say what each does)."""

    @property
    def busy(self) -> bool: ...

    def sync_inline(self, spin: bool) -> None: ...

    async def sync_awaited(self) -> None: ...

    def sync_in_background(self, target: Target | None = None) -> None: ...

    def take_durable(self) -> list[Target]: ...

    async def quiesce(self) -> None: ...

    async def close(self) -> None: ...


class Flusher:
    def __init__(self, store: FileLogStore, on_progress: Callable[[], None],
                 on_failure: Callable[[BaseException], None], spin: SpinSync | None = None,
                 aio: AioFsync | None = None, stats: NodeStats | None = None) -> None:
        self.store = store
        self.stats = stats or NodeStats()  # each group commit's fsync counted and timed
        self.spin = spin  # waits for an inline group commit without idling the CPU, if given
        self.aio = aio  # runs the other fsyncs in the kernel, if given (else the fsync thread)
        self._on_progress = on_progress  # wake the node's loop
        self._on_failure = on_failure
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dledger-fsync")
        self._in_flight: asyncio.Future[None] | None = None
        self._request: Target | None = None
        self._wanted = False  # a background fsync was asked for and has not started
        self._done: list[Target] = []

    @property
    def busy(self) -> bool:
        return self._in_flight is not None

    def sync_inline(self, spin: bool) -> None:
        """Group commit of one Ready on the loop thread (``Node._sync_plan`` says when). ``spin``:
        the fsync is spin-waited, if there is a ``SpinSync`` (for a lone entry on an idle loop, whose
        latency is the point); else it is a plain fdatasync, which leaves the CPU to the other
        processes while the disk works (on a box with fewer cores than replicas, polling would
        take it from them)."""
        waiter = self.spin if spin else None
        started_s = time.perf_counter()
        self.store.sync(waiter.fdatasync if waiter is not None else None)
        self.stats.fsync_done(time.perf_counter() - started_s)

    async def sync_awaited(self) -> None:
        """Group commit of one Ready that the loop awaits while it keeps running. Only the
        fsyncs leave the loop thread: the store's bookkeeping stays on it, where a background
        fsync's sync_end also runs."""
        token = self.store.sync_begin()
        started_s = time.perf_counter()
        try:
            await self._fsync(token)
        except OSError as err:
            raise self.store.fsync_failed(err) from err
        self.store.sync_end(token)
        self.stats.fsync_done(time.perf_counter() - started_s)

    def _fsync(self, token: SyncToken) -> asyncio.Future[None]:
        """The fsyncs of ``token``, through AIO or on the fsync thread (OSError on failure).
        Either way a failure marks the store failed when it happens, even if the waiter is
        gone by then (a cancelled node task): the kernel may have dropped the pages."""
        if self.aio is not None:
            return self.aio.sync(token.fds, token.dir_fd, on_error=self.store.fsync_failed)
        return asyncio.get_running_loop().run_in_executor(self._pool, self.store.fsync_fds, token)

    # -- the leader's background group commit ----------------------------------------------------
    # A leader's appends do not wait for its own fsync (Raft thesis 10.2.1): the core counts the
    # leader's copy only once mark_durable says so, and the loop keeps stepping meanwhile.

    def sync_in_background(self, target: Target | None = None) -> None:
        """Make everything written so far durable, then report ``target`` (if given). The
        ``async`` flush mode's periodic flush comes here too, without a target, so that the loop
        never waits on the disk."""
        self._wanted = True
        if target is not None:
            self._request = target
        self._start()

    def take_durable(self) -> list[Target]:
        done, self._done = self._done, []
        return done

    async def quiesce(self) -> None:
        """Wait until no background fsync is in flight (before truncation, retention, close)."""
        while self._in_flight is not None:
            await asyncio.gather(self._in_flight, return_exceptions=True)
            await asyncio.sleep(0)  # let the done callback run

    async def close(self) -> None:
        await self.quiesce()
        self._pool.shutdown(wait=True)
        if self.spin is not None:
            self.spin.close()
        if self.aio is not None:
            self.aio.close()

    def _start(self) -> None:
        if self._in_flight is not None or not self._wanted:
            return
        target, self._request, self._wanted = self._request, None, False
        try:
            token = self.store.sync_begin()  # writes pending index records: may hit a full disk
        except StorageError as err:
            # Fatal like a failed fsync; this may run in a done callback, which cannot raise.
            log.error("background group commit failed: %s", err)
            self._on_failure(err)
            return
        try:
            fut = self._fsync(token)
        except (ValueError, RuntimeError) as err:  # AIO closed, or the pool shut down
            # (this may run in a done callback, which cannot raise)
            log.error("background group commit could not start: %s", err)
            self._on_failure(err)
            return
        self._in_flight = fut
        started_s = time.perf_counter()
        fut.add_done_callback(lambda f: self._finished(f, token, target, started_s))

    def _finished(self, fut: asyncio.Future[None], token: SyncToken, target: Target | None,
                  started_s: float) -> None:
        self._in_flight = None
        if fut.cancelled():
            return
        err = fut.exception()
        if err is not None:
            # A failed fsync is fatal (the kernel may have dropped the pages): stop serving.
            log.error("background fsync failed: %s", err)
            self._on_failure(self.store.fsync_failed(err) if isinstance(err, OSError) else err)
            return
        self.store.sync_end(token)
        self.stats.fsync_done(time.perf_counter() - started_s)
        if target is not None:
            self._done.append(target)
        self._start()
        self._on_progress()


class StoreFlusher:
    """The flusher of a ``LogStore`` other than the file log: every group commit is its
    ``sync()``, on the loop thread, when asked; so nothing is ever in flight, and a background
    group commit's target is reported (``take_durable``, with a wake-up) as soon as asked for."""

    def __init__(self, store: LogStore, on_progress: Callable[[], None],
                 stats: NodeStats | None = None) -> None:
        self.store = store
        self.stats = stats or NodeStats()
        self._on_progress = on_progress  # wake the node's loop
        self._done: list[Target] = []

    @property
    def busy(self) -> bool:
        return False

    def sync_inline(self, spin: bool) -> None:
        self._sync()

    async def sync_awaited(self) -> None:
        self._sync()

    def sync_in_background(self, target: Target | None = None) -> None:
        self._sync()
        if target is not None:
            self._done.append(target)
            self._on_progress()

    def take_durable(self) -> list[Target]:
        done, self._done = self._done, []
        return done

    async def quiesce(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def _sync(self) -> None:
        started_s = time.perf_counter()
        self.store.sync()
        self.stats.fsync_done(time.perf_counter() - started_s)
