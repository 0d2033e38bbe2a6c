"""Snapshots in the Raft core (Raft section 7): which snapshot a node can send, sending one to a
follower whose next entry retention deleted, and restoring one on the follower. A mixin of
``RaftCore`` (core.py), pure like it.

The core handles only a snapshot's metadata (``SnapshotMeta``): the shell takes snapshots of
its state machine and tells the core (``snapshot_taken``), streams a snapshot's data when the
core sends ``InstallSnapshot`` and reports how that went (``report_snapshot``), and on the
follower steps the core with ``InstallSnapshot`` once the data is staged, then installs it when
a Ready hands it out (``Ready.snapshot``). Safety rules kept here: a snapshot at or below the
commit index is never restored (committed state never moves back); a follower that holds the
snapshot's last entry keeps its log and only commits up to it; a snapshot replaces the whole log
(no entry of the old log survives past it); a node with a snapshot not yet installed does not
campaign (its log is about to be replaced).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dledger.raft.config import RaftConfig
from dledger.raft.log import RaftLog
from dledger.raft.progress import Progress, ProgressState
from dledger.raft.types import AppendResponse, InstallSnapshot, Message, Role, SnapshotMeta


class SnapshotRole:
    # State owned by RaftCore (declared here for the type checker).
    config: RaftConfig
    id: str
    log: RaftLog
    role: Role
    term: int
    progress: dict[str, Progress]
    durable_index: int
    _written_index: int
    write_generation: int
    _inputs: int
    snapshot: SnapshotMeta | None

    def _send(self, m: Message) -> None:
        raise NotImplementedError

    def _follow(self, leader_id: str) -> None:
        raise NotImplementedError

    if TYPE_CHECKING:
        def _note_restored(self, meta: SnapshotMeta) -> None: ...  # (dledger.raft.membership)

    # -- the shell's inputs ----------------------------------------------------------------

    def snapshot_taken(self, meta: SnapshotMeta) -> None:
        """The shell holds a durable snapshot of its state machine at ``meta.index``: the core
        may send it, and retention may delete the entries it covers."""
        self._inputs += 1
        if meta.index > self.log.applied_index:
            raise ValueError(f"snapshot at {meta.index} is past the applied index "
                             f"{self.log.applied_index}")
        if self.snapshot is None or meta.index > self.snapshot.index:
            self.snapshot = meta

    def report_snapshot(self, peer: str, ok: bool) -> None:
        """The shell's transfer of a snapshot to ``peer`` ended: ``ok`` if the whole snapshot
        reached it (its answer still moves the match index), else it failed and is retried."""
        self._inputs += 1
        if self.role is not Role.LEADER:
            return
        pr = self.progress.get(peer)
        if pr is not None and pr.state is ProgressState.SNAPSHOT:
            pr.snapshot_done(ok)

    # -- leader ----------------------------------------------------------------------------

    def _send_snapshot(self, peer: str, pr: Progress) -> bool:
        """The follower needs entries retention deleted: send the latest snapshot instead.
        False if there is none that covers them (nothing can be sent to it then)."""
        snap = self.snapshot
        if snap is None or snap.index < self.log.first_index() - 1:
            return False
        self._send(InstallSnapshot(self.term, self.id, peer, snap))
        pr.become_snapshot(snap.index)
        return True

    def _snapshot_answered(self, pr: Progress) -> None:
        """A success answer from a follower in the snapshot state: once its log reaches what
        this leader still holds, stream to it again."""
        if pr.match_index + 1 >= self.log.first_index():
            pr.become_replicate()
            pr.pending_snapshot = 0

    # -- follower ----------------------------------------------------------------------------

    def _on_install_snapshot(self, m: InstallSnapshot) -> None:
        self._follow(m.src)
        log, meta = self.log, m.meta
        if meta.index <= log.commit_index:
            if not self.config.canaries.snapshot_below_commit:
                # Already past it (a duplicate, or appends got here first): committed state
                # never moves back. Answer where we are.
                self._send(AppendResponse(self.term, self.id, m.src, True, log.commit_index))
                return
        elif (log.pending_snapshot is None and meta.index <= log.last_index()
                and log.match_term(meta.index, meta.term)):
            # We hold its last entry: the log is good up to there; keep it, commit to there.
            log.commit_to(meta.index)
            self._send(AppendResponse(self.term, self.id, m.src, True, meta.index))
            return
        log.restore(meta)
        self.snapshot = meta
        self._note_restored(meta)
        self._send(AppendResponse(self.term, self.id, m.src, True, meta.index))

    def _snapshot_for_shell(self) -> SnapshotMeta | None:
        """The restored snapshot the next Ready hands out for installing (once)."""
        log = self.log
        if log.pending_snapshot is None or log.snapshot_handed_out:
            return None
        log.snapshot_handed_out = True
        return log.pending_snapshot

    def _snapshot_advanced(self, meta: SnapshotMeta) -> None:
        """The shell installed ``meta``: the log is read from the store again, and everything
        the store held before counts as rewritten (older background fsyncs prove nothing)."""
        self.log.snapshot_installed()
        self.durable_index = meta.index
        self._written_index = meta.index
        self.write_generation += 1
