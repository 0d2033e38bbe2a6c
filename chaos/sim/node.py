"""One simulated node (``SimNode``): a Raft core, its in-memory disks (with a model of what a
crash loses), and the shell loop around it, as the real node runtime drives its core. It reaches
its world (``chaos.sim.world``) through ``NodeWorld``: the network, the fault schedule, the
clock, the observer."""

from __future__ import annotations

import random
from typing import Protocol

from dledger.raft.config import RaftConfig
from dledger.raft.core import RaftCore
from dledger.raft.types import Entry, Message, Ready, SnapshotMeta
from dledger.storage.memstore import MemoryHardStateStore, MemoryLogStore

__all__ = ["NodeObserver", "NodeWorld", "SimNode", "Violation"]


class Violation(AssertionError):
    """An invariant the observer (or a node's own loop) found broken: which, and how."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant
        self.detail = detail


class NodeObserver(Protocol):
    """What a node tells the observer (``chaos.sim.observer.Observer``)."""

    def on_appended(self, node: SimNode, entries: tuple[Entry, ...]) -> None: ...

    def on_ready(self, node: SimNode, rd: Ready) -> None: ...

    def on_apply(self, node: SimNode, e: Entry, expected_index: int) -> None: ...

    def on_install(self, node: SimNode, meta: SnapshotMeta, chain: list[int]) -> None: ...

    def on_restart(self, node: SimNode) -> None: ...


class NodeWorld(Protocol):
    """What a node uses of its world (``chaos.sim.world.World``)."""

    @property
    def rng(self) -> random.Random: ...

    @property
    def now(self) -> int: ...

    @property
    def observer(self) -> NodeObserver: ...

    @property
    def nodes(self) -> list[SimNode]: ...

    def send(self, m: Message) -> None: ...

    def crash_now(self, node: SimNode) -> bool: ...

    def write_fails(self, node: SimNode, what: str) -> bool: ...

    def defer_sync(self, node: SimNode, rd: Ready) -> bool: ...

    def fsync_ignored(self, node: SimNode) -> bool: ...

    def on_applied(self, node: SimNode, e: Entry) -> None: ...

    def count(self, kind: str) -> None: ...

    def event(self, text: str) -> None: ...


class SimNode:
    """One node: a core, its disks, and the shell loop around it."""

    def __init__(self, world: NodeWorld, nid: str, config: RaftConfig) -> None:
        self.world = world
        self.id = nid
        self.config = config
        self.store = MemoryLogStore()
        self.hard_state = MemoryHardStateStore()
        self.up = True
        self.restarts = 0
        self.tick_credit = 0.0
        self.down_until = 0
        self.disk_full = False  # a write failed: not taking part until it rebuilds (restart)
        self._chain: list[int] = []  # _chain[k]: prefix hash up to store entry k (index k+1)
        self.background_syncs: list[tuple[int, int, int, int]] = []  # (due tick, index, term, gen)
        # The state machine's latest durable snapshot (its checkpoint) and the chain it holds;
        # snapshots received and not yet installed (in memory: lost in a crash).
        self.snapshot: SnapshotMeta | None = None
        self.snapshot_chain: list[int] = []
        self.staged: dict[tuple[int, int], list[int]] = {}
        self.start()

    def start(self) -> None:
        self.background_syncs = []
        self.staged = {}
        # The state machine restarts from its snapshot, which covers what retention deleted.
        self.applied_index = self.snapshot.index if self.snapshot is not None else 0
        self.core = RaftCore(self.config, self.store, self.hard_state.load(),
                             random.Random(self.world.rng.random()),
                             applied_index=self.applied_index, snapshot=self.snapshot)
        self._rebuild_chain()

    # -- prefix hashes of the visible log (for the observer's Log Matching checks) -------------

    def chain_at(self, index: int) -> int:
        if index <= 0:
            return 0
        return self._chain[index - 1] if index <= len(self._chain) else -1

    def _rebuild_chain(self) -> None:
        # Hashes of retained-away entries are kept: those entries never change.
        del self._chain[self.store.base_index :]
        self._extend_chain(self.store.entries_list)

    def _extend_chain(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        h = self._chain[-1] if self._chain else 0
        for e in entries:
            h = hash((h, e.index, e.term, e.data))
            self._chain.append(h)

    # -- the shell loop -----------------------------------------------------------------------

    def drain(self) -> None:
        obs = self.world.observer
        for _ in range(10_000):
            if not self.up or not self.core.has_ready():
                return
            rd = self.core.ready()
            obs.on_ready(self, rd)
            for m in rd.early_messages:
                self.world.send(m)
            if self.world.crash_now(self):
                return  # power lost after the early sends, before anything of this Ready persisted
            if rd.snapshot is not None:
                self.install(rd.snapshot)
            if rd.hard_state is not None:
                if self.world.write_fails(self, "hard state"):
                    return
                self.hard_state.save(rd.hard_state)
            if rd.entries:
                if self.world.write_fails(self, "append"):
                    return
                self.store.append(rd.entries)
                del self._chain[rd.entries[0].index - 1 :]
                self._extend_chain(rd.entries)
                obs.on_appended(self, rd.entries)
            deferred = bool(rd.entries) and self.world.defer_sync(self, rd)
            if rd.must_sync and not deferred:
                if self.world.write_fails(self, "fsync"):
                    return  # (written, not durable: the rebuild's reopen fsyncs it, as the store's)
                if not self.world.fsync_ignored(self):
                    self.store.sync()
            for m in rd.messages:
                self.world.send(m)
            for e in rd.committed:
                obs.on_apply(self, e, self.applied_index + 1)
                self.applied_index = e.index
                self.world.on_applied(self, e)
            self.core.advance(rd, durable=not deferred)
            if deferred:
                last = rd.entries[-1]
                self.background_syncs.append((self.world.now + self.world.rng.randint(0, 2),
                                              last.index, last.term, self.core.write_generation))
        raise Violation("Liveness", f"{self.id}: the Ready loop did not settle")

    def install(self, meta: SnapshotMeta) -> None:
        """Install a staged snapshot, atomically and durably (as the runtime's rename of a
        staged directory): the log becomes empty after it, the state machine is the snapshot's."""
        chain = self.staged.pop((meta.index, meta.term))
        self.world.observer.on_install(self, meta, chain)
        self.store.reset_to(meta.index, meta.term)
        self._chain = list(chain)
        self.snapshot, self.snapshot_chain = meta, list(chain)
        self.background_syncs = []  # (what they covered is gone)
        if not self.config.canaries.snapshot_skips_state:
            self.applied_index = meta.index
        self.world.count("snapshot_installed")
        self.world.event(f"{self.id} installs snapshot {meta.index} (term {meta.term})")

    def finish_background_syncs(self) -> None:
        """The background fsyncs that are due complete now (a crash before loses their data)."""
        due = [b for b in self.background_syncs if b[0] <= self.world.now]
        if not due:
            return
        self.background_syncs = [b for b in self.background_syncs if b[0] > self.world.now]
        for _, index, term, gen in due:
            if gen == self.core.write_generation:  # else its bytes were rewritten since
                self.store.sync_prefix(index)  # only what was written when the fsync began
            self.core.mark_durable(index, term, gen)
        self.drain()

    def crash(self, rng: random.Random) -> None:
        self.up = False
        self.staged = {}
        self.store.power_loss(rng)  # lose what was not fsynced, maybe tearing the last write

    def restart(self) -> None:
        self.up = True
        self.restarts += 1
        if self.disk_full:
            self.rebuild()
        else:
            self.start()
        self.world.observer.on_restart(self)

    def rebuild(self) -> None:
        """Back from a full disk, in the same process: what was written stays (reopening the
        store fsyncs it), the core is built anew from disk, the state machine keeps what it
        applied (``DiskFullRecovery._rebuild``)."""
        self.disk_full = False
        self.background_syncs = []
        self.store.sync()
        self.core = RaftCore(self.config, self.store, self.hard_state.load(),
                             random.Random(self.world.rng.random()),
                             applied_index=self.applied_index, snapshot=self.snapshot)
        self._rebuild_chain()
