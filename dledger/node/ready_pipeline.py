"""The Ready pipeline of a node: persist -> send -> apply -> advance, with the durability contract
of docs/design.md (a Ready's hard state and entries are written, and fsynced when it must
sync, before any of its messages leaves; committed entries are applied in order after that).

Owns how each Ready's fsync happens (``_sync_plan``: none, inline, spin-waited, awaited while
the loop runs, or the leader's background group commit, whose copy counts once it is durable),
applying committed entries (resolving the proposals' futures, calling the apply listeners) and
retention. It must not take inputs nor decide when a turn runs: ``dledger.node.runtime`` does.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from dledger.node.busy_poll import BusyPolling
from dledger.node.config import AppliedEntry, Committed
from dledger.raft.types import Entry, InstallSnapshot, Ready, Role
from dledger.storage.commitlog import FileLogStore
from dledger.storage.retention import SegmentAge, policy_target, retain_target

__all__ = ["AWAIT", "DEFER", "INLINE", "NO_SYNC", "SPIN", "ReadyPipeline"]

# How the fsync of one Ready's writes happens (ReadyPipeline._sync_plan).
NO_SYNC = 0  # nothing to fsync, or the async flush mode
DEFER = 1  # the leader's background group commit; its copy counts once mark_durable says so
INLINE = 2  # on the loop thread with a plain fdatasync, before the Ready's messages leave
AWAIT = 3  # awaited (AIO or the fsync thread) while the loop runs, before the messages leave
SPIN = 4  # on the loop thread, spin-waited (see Flusher.sync_inline), before the messages leave


class ReadyPipeline(BusyPolling):
    """Persist, send, apply and advance one Ready (a part of ``dledger.node.runtime.Node``)."""

    def _sync_plan(self, rd: Ready) -> int:
        """How the fsync of rd's writes happens, decided before any of rd is done."""
        if not (rd.entries and rd.must_sync and self.config.flush_mode == "sync"):
            return NO_SYNC
        flusher = self._flusher()
        idle = not self._inbox and not self._proposals
        # A leader's fsync goes to the background (its appends to the followers already left as
        # early messages) except for a lone entry on an idle loop: synced inline like a
        # follower's, it saves the two thread hand-offs on the commit path, and the followers
        # fsync meanwhile.
        small = len(rd.entries) <= 2 and idle
        if self._core().can_defer_sync(rd) and not (small and not flusher.busy):
            return DEFER
        # Else a lone entry on an idle loop is synced inline, spin-waited: its latency is the
        # point. A follower's batch is synced inline too: its answer waits for the fsync anyway,
        # and what arrives meanwhile waits in the socket and forms the next, larger batch. Other
        # group commits (a candidate's, a leader's that cannot go to the background) are awaited
        # while the loop keeps running.
        if small:
            return SPIN
        return INLINE if self._core().role is Role.FOLLOWER else AWAIT

    def _truncates(self, rd: Ready) -> bool:
        return bool(rd.entries) and rd.entries[0].index <= self._store().last_index()

    async def _handle_ready(self, rd: Ready) -> bool:
        """Do what rd asks, in the loop task; returns True if its fsync was left to the
        background."""
        if rd.snapshot is not None:  # first: the Ready's entries follow the snapshot
            await self._install_snapshot(rd.snapshot)
        plan = self._sync_plan(rd)
        if self._truncates(rd):
            await self._flusher().quiesce()  # a truncation closes fds a background fsync uses
            if self._disk_full is not None:  # that fsync failed for want of space: stop here
                raise self._disk_full
        if plan != AWAIT:
            return self._do_ready(rd, plan)
        self._write_ready(rd)
        await self._flusher().sync_awaited()
        self._finish_ready(rd)
        return False

    def _do_ready(self, rd: Ready, plan: int) -> bool:
        """Do what rd asks, with no fsync on the thread; returns True if deferred."""
        self._write_ready(rd)
        if plan in (INLINE, SPIN):
            self._flusher().sync_inline(spin=plan == SPIN)
        self._finish_ready(rd)
        return plan == DEFER

    def _write_ready(self, rd: Ready) -> None:
        transport = self.transport
        assert transport is not None and self._hard_state is not None
        for m in rd.early_messages:
            transport.send(m)
        if rd.hard_state is not None:
            self._hard_state.save(rd.hard_state)  # atomic and fsynced
            if self.trace is not None:
                self.trace.persisted(rd.hard_state)
        if rd.entries:
            self._store().append(rd.entries)

    def _finish_ready(self, rd: Ready) -> None:
        transport = self.transport
        assert transport is not None
        for m in rd.messages:
            if type(m) is InstallSnapshot:
                self._start_snapshot_send(m)  # streamed (dledger.snapshots.shell), not sent as is
            else:
                transport.send(m)
        if self.config.busy_poll_us and rd.entries and rd.messages and self._core().role is Role.FOLLOWER:
            self._note_ack()  # (its answer left with rd.messages)
        if rd.committed:
            self._apply(rd.committed)
            if self.trace is not None:
                self.trace.committed(rd.committed[-1])

    def _advance(self, rd: Ready, deferred: bool) -> None:
        core = self._core()
        core.advance(rd, durable=not deferred)
        if deferred:
            last = rd.entries[-1]
            self._flusher().sync_in_background((last.index, last.term, core.write_generation))

    def _apply(self, entries: Sequence[Entry]) -> None:
        pending, listeners = self._pending, self._listeners
        if pending or listeners:  # (a follower with no listener has nothing to tell)
            positions = self._store().positions_of(entries[0].index, entries[-1].index)
            if pending:
                pop = pending.pop
                for e, position in zip(entries, positions):
                    fut = pop((e.term, e.index), None)
                    if fut is not None and not fut.done():
                        fut.set_result(Committed(e.index, e.term, position))
            if listeners:
                applied = [AppliedEntry(e.index, e.term, e.kind, e.data, position)
                           for e, position in zip(entries, positions)]
                for listener in listeners:
                    listener(applied)
        top = entries[-1].index
        if self._apply_waiters:
            still = []
            for index, waiter in self._apply_waiters:
                if index <= top:
                    if not waiter.done():
                        waiter.set_result(None)
                else:
                    still.append((index, waiter))
            self._apply_waiters = still

    def _policy_target(self) -> int:
        """What RocketMQ's rules would retain from, from the segments' files and the disk."""
        store, policy = self._store(), self._retention
        if not isinstance(store, FileLogStore):  # (no files, no ages: only with snapshots, which
            return 1  # need the node's own file log, dledger.node.seams)
        segments = []
        for first, path in store.segment_files():
            try:
                segments.append(SegmentAge(first, os.stat(path).st_mtime))
            except FileNotFoundError:
                return 1  # (retention is under way elsewhere: look again next round)
        try:
            st = os.statvfs(self.config.data_dir)
            used = 1.0 - st.f_bavail / st.f_blocks if st.f_blocks else 0.0
        except OSError:
            used = 0.0
        now = time.time()
        return policy_target(policy, segments, store.last_index(), now,
                             time.localtime(now).tm_hour, used)

    async def _maybe_retain(self) -> None:
        store, core, policy = self._store(), self._core(), self._retention
        if self._snapshot_provider is None:
            # Without snapshots only the entry count applies, and never what a member needs.
            if policy.keep_entries is None:
                return
            target = min(core.safe_retain_index(), store.last_index() - policy.keep_entries)
        else:
            if not policy.deletes_anything:
                return
            target = retain_target(
                self._policy_target(), applied_index=core.log.applied_index,
                snapshot_index=core.snapshot.index if core.snapshot is not None else 0,
                durable_index=core.durable_index, members_need_index=core.safe_retain_index(),
                last_index=store.last_index(), lag_entries=self.config.retention_lag_entries)
        if target > store.first_index():
            await self._flusher().quiesce()  # retention closes files a background fsync may use
            if self._disk_full is not None:
                raise self._disk_full
            before = store.first_index()
            after = store.retain_from(target)
            self.stats.retained(after - before)
            self.events.retained(before, after)
