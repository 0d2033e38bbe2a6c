"""The broker's checkpoints, and its side of Raft snapshots (``dledger.snapshots.shell``'s
``SnapshotProvider``).

A checkpoint is the state machine at an applied index, so that a restart replays only the log
after it: ``broker.checkpoint`` (CRC32 then the state's CBOR snapshot, written atomically) plus
the consume-queue files it counts (``broker.core.cq_files``: flushed and fsynced first; the checkpoint
records where each queue ends). The key index is checkpointed alongside and never lags it.
After a checkpoint is durable, the log may be retained up to it, the files of deleted topics'
queues go, and the queues' files whose messages the log no longer holds are deleted.

A snapshot sent to a follower is the latest checkpoint and the consume-queue files, opened at
once (later checkpoints and retention do not change what is sent), plus the log the node keeps.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
import zlib
from collections import OrderedDict
from typing import Protocol

from broker.config import BrokerConfig
from broker.core.applied import ApplyResult
from broker.core.consumequeue import QueueStore
from broker.core.cq_files import FileConsumeQueue, FileQueues
from broker.core.state import StateConfig
from broker.features.query.index import KeyIndex, open_index
from broker.machine.snapshot_view import SnapshotView
from broker.machine.state import BrokerState, CheckpointAheadError
from dledger.node.heap import release_free_heap
from dledger.node.runtime import Node
from dledger.raft.types import SnapshotMeta
from dledger.storage.commitlog import FileLogStore
from dledger.storage.hardstate import write_file_atomically
from dledger.storage.seams import LogStore
from protocol.broker_errors import BadEntryError

log = logging.getLogger("broker.shell.checkpoint")

CHECKPOINT_FILE = "broker.checkpoint"
QUEUES_DIR = "consumequeue"
SNAPSHOT_DERIVED = ("index",)  # rebuilt from the log when a snapshot is installed (key index)
CHECKPOINT_DUTY = 50  # checkpoints are spaced at least 50x the time a snapshot took
HEAP_TRIM_INTERVAL_S = 1.0


class CheckpointHost(Protocol):
    """What checkpoints use of their broker (``broker.api.broker.Broker``): its configuration,
    its node, and its state machine and key index, which a snapshot install replaces."""

    config: BrokerConfig
    state_config: StateConfig
    state: BrokerState
    index: KeyIndex
    results: OrderedDict[int, ApplyResult]

    @property
    def node(self) -> Node: ...


class Checkpoints:
    """Writes the broker's checkpoints on a period and serves snapshots of them."""

    def __init__(self, server: CheckpointHost, interval_s: float) -> None:
        self.server = server
        self.interval_s = interval_s
        self.checkpointed_index = server.state.applied_index  # what the checkpoint file holds
        self.written = 0  # checkpoints written since start, and those a failed write lost
        self.failed = 0
        # Held by a checkpoint write (the files may change any moment) or a snapshot install.
        self.lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._trimmer: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.interval_s > 0:
            self._task = asyncio.create_task(self._loop())
        self._trimmer = asyncio.create_task(self._trim_heap())

    async def stop(self) -> None:
        """Stop the period, and write a last checkpoint if anything was applied since: a clean
        restart replays nothing (a crash replays up to a period's entries)."""
        tasks = [t for t in (self._task, self._trimmer) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._task is not None and self.server.state.applied_index > self.checkpointed_index:
            async with self.lock:
                await self.write()

    async def _trim_heap(self) -> None:
        """Freed heap back to the system every second (``dledger.node.heap``: a fraction of a
        millisecond each), so that RSS follows what the node holds, not its busiest moment."""
        while True:
            await asyncio.sleep(HEAP_TRIM_INTERVAL_S)
            release_free_heap()

    async def _loop(self) -> None:
        wait_s = self.interval_s
        while True:
            await asyncio.sleep(wait_s)  # the checkpoint period
            if self.server.state.applied_index > self.checkpointed_index:
                async with self.lock:  # (a snapshot install waits for it)
                    spent_s = await self.write()
                # A snapshot costs time in proportion to the state: space them so that they
                # take at most 1/CHECKPOINT_DUTY of the loop, however large the state grows.
                wait_s = max(self.interval_s, spent_s * CHECKPOINT_DUTY)

    async def write(self) -> float:
        """Write the checkpoint (and the key index) at the applied index; returns how long the
        snapshot of the state took on the loop."""
        server = self.server
        state, data_dir = server.state, server.config.node.data_dir
        saved = state.applied_index
        t0 = time.perf_counter()
        queues = state.queue_store
        sync_queues = queues.sync_job() if isinstance(queues, FileQueues) else None
        dropped = queues.take_dropped() if isinstance(queues, FileQueues) else []
        store = server.node.store
        index_job = server.index.checkpoint(store.first_index() if store else 1)
        # on the loop, with no await since sync_job: a consistent view (the bulk read in place),
        # taken last, so that nothing can raise between it and the release below
        view = state.snapshot_view()
        spent_s = time.perf_counter() - t0

        def job() -> None:
            if sync_queues is not None:
                sync_queues()  # the files first: the checkpoint counts their units
            index_job()  # the key index next: it never lags the checkpoint
            save_checkpoint(data_dir, view)

        thread = asyncio.ensure_future(asyncio.to_thread(job))
        done = False
        try:
            try:
                await asyncio.shield(thread)
            except asyncio.CancelledError:  # (a stop: the job runs to its end first, so that
                await asyncio.wait([thread])  # nothing it reads is released under it, and the
                if not thread.cancelled():  # stop's own checkpoint is not written beside it)
                    thread.exception()  # (retrieved: this checkpoint counts as not written)
                raise
        except OSError as err:  # e.g. a full disk: the log still has it all; next time
            log.warning("checkpoint at index %d not written: %s", saved, err)
            self.failed += 1
        else:
            done = True
            self.written += 1
            self.checkpointed_index = saved
            if sync_queues is not None:
                sync_queues.written()  # (their units leave memory now that files hold them)
            server.node.snapshot_taken(saved)  # the log may be retained up to it
            if isinstance(queues, FileQueues) and queues is server.state.queue_store:
                await asyncio.to_thread(queues.remove_queues, dropped)
                self.trim_queues(queues)
        finally:
            if not done:  # (what this checkpoint was to settle is owed to the next)
                if sync_queues is not None:
                    sync_queues.failed()
                if isinstance(queues, FileQueues):
                    queues.dropped.extend(dropped)
            view.release()
            server.index.checkpoint_done()
        return spent_s

    def trim_queues(self, queues: FileQueues) -> None:
        """Delete consume-queue files whose messages the log no longer holds."""
        store = self.server.node.store
        if store is None or store.first_index() <= 1 or store.last_index() < store.first_index():
            return
        first_position = store.position_of(store.first_index())
        for queue in list(self.server.state.queues.values()):
            if isinstance(queue, FileConsumeQueue):
                queue.trim(first_position)

    # -- snapshots ---------------------------------------------------------------------------------

    def snapshot_source(self) -> tuple[int, list[tuple[str, int]]] | None:
        """The checkpoint file and the consume-queue files, opened now, and the applied index the
        checkpoint holds (None while one is being written; the transfer is retried). Queue files
        may hold units past the checkpoint: a restore cuts them back."""
        if self.lock.locked() or self.checkpointed_index == 0:
            return None
        data_dir = self.server.config.node.data_dir
        files: list[tuple[str, int]] = []
        try:
            files.append((CHECKPOINT_FILE, os.open(os.path.join(data_dir, CHECKPOINT_FILE),
                                                   os.O_RDONLY)))
            root = os.path.join(data_dir, QUEUES_DIR)
            for queue_dir in sorted(os.listdir(root)) if os.path.isdir(root) else []:
                for name in sorted(os.listdir(os.path.join(root, queue_dir))):
                    path = os.path.join(root, queue_dir, name)
                    files.append((f"{QUEUES_DIR}/{queue_dir}/{name}", os.open(path, os.O_RDONLY)))
        except BaseException:
            for _, fd in files:
                os.close(fd)
            raise
        return self.checkpointed_index, files

    def snapshot_derived(self) -> tuple[str, ...]:
        return SNAPSHOT_DERIVED

    async def snapshot_installing(self) -> None:
        """A snapshot is about to replace the checkpoint and the queues' files: no checkpoint
        write may run until it is installed (an older state written after it would undo it)."""
        await self.lock.acquire()
        queues = self.server.state.queue_store
        if isinstance(queues, FileQueues):
            queues.close()

    def snapshot_installed(self, meta: SnapshotMeta) -> None:
        """A snapshot replaced the checkpoint, the queues and the log: load them, re-index."""
        try:
            self._reload(meta)
        finally:
            self.lock.release()

    def _reload(self, meta: SnapshotMeta) -> None:
        server = self.server
        data_dir = server.config.node.data_dir
        verify = not server.config.node.canaries.skip_checksum
        state = load_checkpoint(data_dir, verify, server.state_config, server.node.store,
                                queue_files=True, canaries=server.config.canaries)
        if state.applied_index != meta.index:
            raise BadEntryError(f"the installed checkpoint is at {state.applied_index}, "
                                f"not at the snapshot's {meta.index}")
        server.state = state
        self.checkpointed_index = meta.index
        server.results.clear()
        server.index.close()
        server.index = open_index(data_dir, server.config.index, state.registry, meta.index,
                                  verify, server.node.store)


def save_checkpoint(data_dir: str, snapshot: bytes | SnapshotView) -> None:
    """The state machine's checkpoint: CRC32 then the snapshot, written atomically. A view is
    read twice (its checksum, then its bytes), a chunk at a time: never whole in memory."""
    if isinstance(snapshot, bytes):
        snapshot = SnapshotView([snapshot], lambda: None)
    write_file_atomically(os.path.join(data_dir, CHECKPOINT_FILE),
                          itertools.chain([snapshot.crc32().to_bytes(4, "big")], snapshot))


def load_checkpoint(data_dir: str, verify_checksums: bool = True,
                    config: StateConfig | None = None, store: LogStore | None = None,
                    queue_files: bool = False, canaries: frozenset[str] = frozenset()) -> BrokerState:
    """The last checkpoint, or an empty state (the log is then replayed from the start). A
    checkpoint that is damaged, or ahead of what the log holds (a power loss took entries the
    leader had applied before its own fsync), or whose queue files are short, is set aside
    rather than trusted. ``queue_files``: queues in files under the data directory (a broker
    process), cut back to the checkpoint; else in memory."""
    config = config or StateConfig()
    queues: QueueStore | None = None
    if queue_files:
        queues = FileQueues(os.path.join(data_dir, QUEUES_DIR),
                            keep_tail="cq_keep_tail" in canaries)
    state = _trusted(data_dir, verify_checksums, config, store, queues)
    if state is None:
        state = BrokerState(config)
        if queues is not None:
            state.queue_store = queues
    if isinstance(queues, FileQueues):
        queues.keep_only({q.no for q in state.queues.values()})
    return state


def _trusted(data_dir: str, verify_checksums: bool, config: StateConfig,
             store: LogStore | None, queues: QueueStore | None) -> BrokerState | None:
    path = os.path.join(data_dir, CHECKPOINT_FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    blob = memoryview(raw)[4:]  # (not a second copy of a large checkpoint)
    if len(raw) < 4 or zlib.crc32(blob) != int.from_bytes(raw[:4], "big"):
        log.warning("ignoring checkpoint %s: checksum mismatch", path)
        return None
    last = _log_end(data_dir, verify_checksums, store)
    try:
        return BrokerState.restore(blob, config, queues, applied_at_most=last)
    except CheckpointAheadError as err:
        log.warning("ignoring checkpoint at %d: the log ends at %d", err.applied_index, last)
        return None
    except BadEntryError as err:  # (short or damaged queue files among them)
        log.warning("ignoring checkpoint %s: %s", path, err)
        return None


def _log_end(data_dir: str, verify_checksums: bool, store: LogStore | None) -> int:
    log_dir = os.path.join(data_dir, "log")
    if store is not None:  # (the node's, open)
        return store.last_index()
    if os.path.isdir(log_dir):
        opened = FileLogStore.open(log_dir, verify_checksums=verify_checksums)
        last = opened.last_index()
        opened.close()
        return last
    return 0
