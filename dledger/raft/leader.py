"""The leader's side of the Raft core: replication to followers (probe/replicate progress, a
bounded in-flight window, batches bounded in entries and bytes, fast back-tracking on
rejections), heartbeats, check-quorum, the commit rule, leadership transfer and the preferred
leader. A mixin of ``RaftCore`` (core.py), split out only to keep modules small; pure like it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dledger.raft.config import RaftConfig
from dledger.raft.log import RaftLog
from dledger.raft.progress import Progress, ProgressState
from dledger.raft.quorum import committed_index
from dledger.raft.types import (
    AppendRequest,
    AppendResponse,
    Entry,
    Heartbeat,
    HeartbeatResponse,
    Message,
    Role,
    TimeoutNow,
)
from protocol.errors import NotLeaderError


class LeaderRole:
    # State owned by RaftCore (declared here for the type checker).
    config: RaftConfig
    id: str
    log: RaftLog
    role: Role
    term: int
    leader_id: str | None
    progress: dict[str, Progress]
    transferee: str | None
    transfer_elapsed: int
    election_elapsed: int
    heartbeat_elapsed: int
    tick_count: int
    durable_index: int
    uncommitted_bytes: int
    _uncommitted: deque[tuple[int, int]]
    _inputs: int
    _appends_flushed_at: int
    lazy_peers: frozenset[str]

    def _send(self, m: Message) -> None:
        raise NotImplementedError

    def _become_follower(self, term: int, leader_id: str | None) -> None:
        raise NotImplementedError

    if TYPE_CHECKING:  # (provided by dledger.raft.snapshots and dledger.raft.membership)
        def _send_snapshot(self, peer: str, pr: Progress) -> bool: ...

        def _snapshot_answered(self, pr: Progress) -> None: ...

        @property
        def voters(self) -> tuple[str, ...]: ...

        @property
        def quorum(self) -> int: ...

        def _membership_committed(self) -> None: ...

    def transfer_leadership(self, to: str) -> None:
        self._inputs += 1
        if self.role is not Role.LEADER:
            raise NotLeaderError(self.leader_id, self.term)
        if to not in self.voters:
            raise ValueError(f"{to!r} is not a voter of the group")
        if to == self.id or self.transferee == to:
            return
        self.transferee = to
        self.transfer_elapsed = 0  # the transfer must finish within one election timeout
        self._maybe_send_timeout_now(to)

    def _maybe_send_timeout_now(self, to: str) -> None:
        """Once the transferee holds our whole log, tell it to campaign (again, if the first
        TimeoutNow was lost: this runs on every response from it while the transfer lasts)."""
        pr = self.progress[to]
        if pr.match_index == self.log.last_index():
            self._send(TimeoutNow(self.term, self.id, to))
        else:
            pr.needs_send = True

    # ======================================================================================
    # handlers: replication (leader side)
    # ======================================================================================

    def _on_append_response(self, m: AppendResponse) -> None:
        pr = self._active_progress(m.src)
        if pr is None:
            return
        if not m.success:
            hint = m.conflict_index
            if m.conflict_term > 0:
                hint = self.log.last_index_with_term_at_most(m.conflict_index, m.conflict_term)
            if pr.maybe_decrease_to(m.index, hint):
                if pr.state is ProgressState.REPLICATE:
                    pr.become_probe()
                pr.needs_send = True
            return
        was_probe = pr.state is ProgressState.PROBE
        updated = pr.maybe_update(m.index)
        if pr.state is ProgressState.SNAPSHOT:
            self._snapshot_answered(pr)
        elif was_probe and (updated or pr.match_index == m.index):
            pr.become_replicate()
        if updated:
            self._maybe_commit()
            if self.transferee == m.src:
                self._maybe_send_timeout_now(m.src)

    def _on_heartbeat_response(self, m: HeartbeatResponse) -> None:
        pr = self._active_progress(m.src)
        if pr is None:
            return
        pr.probe_sent = False
        if pr.state is ProgressState.REPLICATE and pr.is_paused():
            pr.free_first_one()  # a response was lost: let one more append out
        if pr.match_index < self.log.last_index() or m.unverified:
            pr.needs_send = True
        if self.transferee == m.src:
            self._maybe_send_timeout_now(m.src)

    def _active_progress(self, peer: str) -> Progress | None:
        if self.role is not Role.LEADER:
            return None
        pr = self.progress.get(peer)
        if pr is not None:
            pr.recent_active = True
            pr.last_contact_tick = self.tick_count
        return pr

    # ======================================================================================
    # leader internals
    # ======================================================================================

    def _tick_leader(self) -> None:
        self.heartbeat_elapsed += 1
        if self.transferee is not None:
            self.transfer_elapsed += 1
            if self.transfer_elapsed >= self.config.election_ticks:
                self.transferee = None  # the transfer did not finish in time: abort it
        if self.election_elapsed >= self.config.election_ticks:
            self.election_elapsed = 0
            if self.config.check_quorum and not self._quorum_active():
                self._become_follower(self.term, None)  # we may be partitioned: step down
                return
            self._maybe_hand_to_preferred()
            for pr in self.progress.values():
                pr.recent_active = False
        if self.heartbeat_elapsed >= self.config.heartbeat_ticks:
            self.heartbeat_elapsed = 0
            self._broadcast_heartbeat()
            if self.config.quorum_first:
                self._pick_lazy_peers()

    def _pick_lazy_peers(self) -> None:
        """Quorum-first replication: keep quorum - 1 followers eager, those in the replicate
        state that answered within the last tick, the most caught up first (the eager ones
        before on a tie, so the pick stays put); the rest are lazy. With too few such followers,
        none is lazy. Every lazy follower with entries to get is sent them now (the heartbeat
        batch), so none lags by more than a tick."""
        voters = self.voters
        need = self.quorum - (1 if self.id in voters else 0)
        fresh = [p for p, pr in self.progress.items()
                 if p in voters and pr.state is ProgressState.REPLICATE
                 and pr.last_contact_tick >= self.tick_count - 1]
        if len(fresh) < need:
            self.lazy_peers = frozenset()
        else:
            fresh.sort(key=lambda p: (-self.progress[p].match_index, p in self.lazy_peers, p))
            eager = set(fresh[:need])
            if self.transferee is not None:
                eager.add(self.transferee)
            self.lazy_peers = frozenset(p for p in self.progress if p not in eager)
        last = self.log.last_index()
        for p in self.lazy_peers:
            pr = self.progress[p]
            if pr.next_index <= last:
                pr.needs_send = True

    def _quorum_active(self) -> bool:
        voters = self.voters
        active = (self.id in voters) + sum(1 for p, pr in self.progress.items()
                                           if pr.recent_active and p in voters)
        return active >= self.quorum

    def _maybe_hand_to_preferred(self) -> None:
        preferred = self.config.preferred_leader
        if preferred is None or preferred == self.id or self.transferee is not None:
            return
        pr = self.progress.get(preferred)
        if pr is None or preferred not in self.voters:
            return
        # Only a caught-up preferred node gets leadership: a transfer blocks proposals, and a
        # lagging one would block them again at every election timeout.
        if pr.recent_active and pr.match_index == self.log.last_index():
            self.transfer_leadership(preferred)

    def _broadcast_heartbeat(self) -> None:
        retain = self._group_retain_index()
        for peer, pr in self.progress.items():
            commit = min(self.log.commit_index, pr.match_index)
            self._send(Heartbeat(self.term, self.id, peer, commit, retain))

    def _group_retain_index(self) -> int:
        matches = [pr.match_index for pr in self.progress.values()]
        return min(matches, default=self.log.last_index()) + 1

    def _append_as_leader(self, entries: Sequence[Entry], size: int | None = None) -> None:
        """Append new entries of this term; ``size`` is their total size_bytes, if known."""
        self.log.append(entries)
        if size is None:
            size = sum(e.size_bytes for e in entries)
        self._uncommitted.append((entries[-1].index, size))
        self.uncommitted_bytes += size

    def _maybe_commit(self) -> None:
        voters = self.voters
        matches = [pr.match_index for p, pr in self.progress.items() if p in voters]
        if self.id in voters:  # (a leader removing itself counts only the others)
            matches.append(self._self_match_index())
        index = committed_index(matches)
        if self.config.canaries.commit_without_quorum:
            index = max(index, self._self_match_index())
        if index <= self.log.commit_index:
            return
        # Raft 5.4.2: only an entry of the current term is committed by counting replicas;
        # earlier entries commit indirectly with it (the Figure 8 rule).
        if self.log.term_at(index) != self.term and not self.config.canaries.commit_previous_term:
            return
        self.log.commit_to(index)
        while self._uncommitted and self._uncommitted[0][0] <= index:
            self.uncommitted_bytes -= self._uncommitted.popleft()[1]
        self._membership_committed()

    def _self_match_index(self) -> int:
        """How far our own log counts towards a quorum: only what is written and durable."""
        if self.config.canaries.count_self_before_durable:
            return self.log.last_index()
        return min(self.log.persisted_index(), self.durable_index)

    def _clear_uncommitted(self) -> None:
        self._uncommitted.clear()
        self.uncommitted_bytes = 0

    def _flush_appends(self) -> None:
        if self.role is not Role.LEADER or self._appends_flushed_at == self._inputs:
            return  # (nothing happened since the last flush, which sent all it could)
        self._appends_flushed_at = self._inputs
        last = self.log.last_index()
        # Followers in step get the same entries: read them once per flush.
        batches: dict[int, tuple[Entry, ...]] = {}
        lazy, lazy_batch = self.lazy_peers, self.config.lazy_batch_entries
        for peer, pr in self.progress.items():
            if peer in lazy and not pr.needs_send and last - pr.next_index + 1 < lazy_batch:
                continue  # (quorum-first: a lazy follower waits for a batch or the heartbeat)
            while not pr.is_paused() and (pr.next_index <= last or pr.needs_send):
                if not self._send_append(peer, pr, last, batches):
                    break

    def _send_append(self, peer: str, pr: Progress, last: int,
                     batches: dict[int, tuple[Entry, ...]]) -> bool:
        prev = pr.next_index - 1
        if prev < self.log.first_index() - 1:  # the follower needs entries retention deleted
            return self._send_snapshot(peer, pr)
        entries = batches.get(pr.next_index)
        if entries is None:
            hi = min(last + 1, pr.next_index + self.config.max_append_entries)
            entries = tuple(self.log.slice(pr.next_index, hi, self.config.max_append_bytes))
            batches[pr.next_index] = entries
        self._send(AppendRequest(self.term, self.id, peer, prev, self.log.term_at(prev),
                                 entries, self.log.commit_index))
        pr.sent(entries[-1].index if entries else prev)
        return True
