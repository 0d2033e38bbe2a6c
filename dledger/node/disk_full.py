"""A node whose disk is full stays up (``DiskFullRecovery``, a part of ``dledger.node.runtime.Node``).

When a write the Raft core asked for fails for want of space (``DiskFullError``: an append, the
hard state, a group commit, retention's meta file), the core's in-memory state has already moved
on as if the write had happened: a follower counts the entries as its own, a candidate its vote.
So the node must not go on from that state. It stops driving the core at once (no tick, no
step, no Ready: a follower that cannot write answers no append, a candidate that cannot persist
its vote asks for none, a leader sends no more heartbeats, so the others elect a new one), fails
what waits on it with named errors, and refuses new proposals with ``DiskFullError``. Status
and reads of committed entries are still answered from what it holds. Every
``disk_probe_interval_s`` it looks at the free space of its data directory; once there is
``disk_resume_free_bytes``, it rebuilds the core from what is durable on disk, as a restart
would (the log store reopened and recovered, the hard state read back), and rejoins as a
follower. The process, its listeners and its transport stay up throughout. A log store the node
was given (``dledger.node.seams``) is not reopened: the new core is built on it as it is, and
with both stores given there is no data directory to look at, so each probe tries.

Owns that cycle and building a core from the stores (also used by ``start``). Other storage
errors stay fatal: the node stops, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random

from dledger.node.proposals import Proposals
from dledger.raft.core import RaftCore
from dledger.raft.types import Role, Status
from protocol.errors import DiskFullError, LeadershipLostError

__all__ = ["DiskFullRecovery"]

log = logging.getLogger("dledger.node.runtime")


class DiskFullRecovery(Proposals):
    """Riding out a full disk (a part of ``dledger.node.runtime.Node``)."""

    @property
    def disk_full(self) -> DiskFullError | None:
        """The write that failed for want of space, while the node waits for room; else None."""
        return self._disk_full

    # -- building the core from the stores (start, and after a full disk) ---------------------

    def _open_core(self, applied_index: int) -> None:
        """Open and recover the log store (or take the given one), read the hard state, and
        build a core on them."""
        cfg = self.config
        assert self._hard_state is not None
        self.store = self._open_log()
        meta = self._snapshot_meta
        base = (meta.index, meta.membership) if meta is not None else self._saved_membership()
        self.core = RaftCore(cfg.raft_config(), self.store, self._hard_state.load(),
                             random.Random(self._rng.random()), applied_index=applied_index,
                             membership_at=base, recovering=self._recovering_marker)
        meta = meta or self._initial_snapshot(applied_index)
        if meta is not None:
            self.core.snapshot_taken(meta)
            self._snapshot_meta = meta

    # -- the cycle --------------------------------------------------------------------------------

    def _enter_disk_full(self, err: DiskFullError) -> None:
        """A write failed for want of space: freeze the core, fail its waiters, wake the loop
        task (which rides it out). Safe from a callback; idempotent."""
        if self._disk_full is None:
            log.warning("node %s: %s; not taking part until the disk has room again",
                        self.config.node_id, err)
        self._disk_full = err
        self._parked = False  # no direct turn may run on the frozen core
        self._handoff = None  # nor may the Ready a direct turn left
        self._inbox.clear()
        self._leader_term = None
        self._fail_all(LeadershipLostError(
            f"{self.config.node_id} cannot write ({err}); the proposal may still commit"))
        if self._wake is not None:
            self._wake.set()

    async def _ride_out_disk_full(self) -> None:
        """In the loop task: wait until the disk has room, then rebuild the core from disk.
        Messages that arrive meanwhile are dropped unanswered. Returns on rebuild or stop."""
        if self.flusher is not None:
            await self.flusher.quiesce()  # (nothing may fsync a store being closed)
        loop = asyncio.get_running_loop()
        wake = self._wake
        assert wake is not None
        probe_at = loop.time()
        while not self._stopping:
            self._inbox.clear()
            if loop.time() >= probe_at:
                probe_at = loop.time() + self.config.disk_probe_interval_s
                if self._has_room() and await self._rebuild():
                    return
            wake.clear()
            with contextlib.suppress(TimeoutError):  # a stop, a message or a tick wakes it
                await asyncio.wait_for(wake.wait(), max(0.0, probe_at - loop.time()))

    def _has_room(self) -> bool:
        if self._given_log is not None and self._given_hard_state is not None:
            return True  # (no data directory of its own: the stores' next writes will tell)
        try:
            st = os.statvfs(self.config.data_dir)
        except OSError as err:
            log.warning("node %s: cannot read the free space of %s: %s", self.config.node_id,
                        self.config.data_dir, err)
            return False
        return st.f_bavail * st.f_frsize >= self.config.disk_resume_free_bytes

    async def _rebuild(self) -> bool:
        """Close the flusher and the store, reopen the store (recovery fsyncs what it finds)
        and build a new core on it and the hard state on disk. The state machine keeps what
        it applied: the new core starts from the old one's applied index (every applied entry
        was read from the store, so the store holds it). False if there is still no room."""
        applied_index = self._core().log.applied_index
        if self.flusher is not None:
            await self.flusher.close()
            self.flusher = None
        self._close_log()  # (a closed store's close does nothing; a given one stays open)
        try:
            self._open_core(applied_index)
        except DiskFullError as err:
            log.warning("node %s: no room yet to reopen its log: %s", self.config.node_id, err)
            return False
        self.flusher = self._open_flusher(self._store())
        self._disk_full = None
        core = self._core()
        log.warning("node %s: the disk has room again; rebuilt from disk at term %d, last index "
                    "%d; rejoining", self.config.node_id, core.term, core.log.last_index())
        return True

    def _disk_full_status(self, raft: Status) -> Status:
        """What the frozen core shows while the disk is full: it neither leads nor follows."""
        return dataclasses.replace(raft, role=Role.FOLLOWER, leader_id=None, followers=())
