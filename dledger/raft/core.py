"""The Raft consensus core of one node: election (pre-vote, check-quorum, leader lease on votes),
log replication (probe/replicate with a bounded in-flight window, fast back-tracking), the
commit rule (current-term entries only, counted after the leader's own copy is durable),
leadership transfer and the preferred-leader option.

Pure and deterministic: no I/O, no clock, no global randomness. Inputs are ``tick()``,
``step(message)``, ``propose(data)`` and ``transfer_leadership(to)``; outputs are drained as one
``Ready`` batch and acknowledged with ``advance(ready)`` (see types.Ready for the contract).
The shell must not call ``step``/``tick``/``propose`` between ``ready()`` and ``advance()``.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dledger.raft.config import RaftConfig
from dledger.raft.election import _FROM_LEADER, ElectionRole
from dledger.raft.leader import LeaderRole
from dledger.raft.log import RaftLog
from dledger.raft.membership import MembershipRole
from dledger.raft.progress import Progress
from dledger.raft.snapshots import SnapshotRole
from dledger.raft.types import (
    ENTRY_OVERHEAD_BYTES,
    AppendRequest,
    AppendResponse,
    EntryKind,
    FollowerStatus,
    HardState,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    LogReader,
    Membership,
    Message,
    Ready,
    Role,
    SnapshotMeta,
    Status,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
    build_entries,
)
from protocol.errors import LeadershipTransferInProgressError, NotLeaderError, OverloadedError

if TYPE_CHECKING:  # the core only uses the Random instance it is given, never the global one
    import random

_LEADER_EARLY = (AppendRequest, Heartbeat)
_CANARY_EARLY = (AppendRequest, Heartbeat, AppendResponse)
_FROM_ANYONE = (VoteRequest, VoteResponse, *_FROM_LEADER)  # (see RaftCore._from_member)


class RaftCore(ElectionRole, SnapshotRole, MembershipRole, LeaderRole):
    def __init__(self, config: RaftConfig, log_reader: LogReader, hard_state: HardState,
                 rng: random.Random, applied_index: int = 0,
                 snapshot: SnapshotMeta | None = None,
                 membership_at: tuple[int, Membership] | None = None,
                 recovering: bool = False) -> None:
        """``applied_index``: how far the state machine is (its checkpoint); ``snapshot``: the
        latest snapshot of it the shell holds (which it can send, and retention may cut to);
        ``membership_at``: the membership as of an index the log holds or follows (the shell
        saved it; default: the snapshot's, else the configured voters as of the log's start).
        ``recovering``: this node lost its disk (it started with no term and vote): what it
        acknowledged and voted before is forgotten, so it votes only for a candidate with an
        empty log (a group's first election) until it holds an entry of the term of a leader
        it follows (then its log has everything committed before that leader's term)."""
        self.config = config
        self.id = config.node_id
        self.rng = rng
        self.log = RaftLog(log_reader, applied_index, config.max_cache_bytes)
        self.term = hard_state.term
        self.voted_for = hard_state.voted_for
        self._persisted_hard_state = HardState(hard_state.term, hard_state.voted_for)
        self._pending_hard_state: HardState | None = None
        # Durability of our own log, which may lag what was written (a leader may fsync in the
        # background, Raft thesis 10.2.1): the leader counts itself only up to durable_index.
        self.durable_index = self.log.persisted_index()
        self._written_index = self.durable_index  # last index the shell has written
        self.write_generation = 0  # bumped by every truncation: older fsyncs prove nothing
        self.role = Role.FOLLOWER
        self.leader_id: str | None = None
        self.votes: dict[str, bool] = {}
        self.progress: dict[str, Progress] = {}
        self.transferee: str | None = None
        self.transfer_elapsed = 0
        self.term_start_index = 0  # as leader: the index of this term's no-op
        self.retain_index = 0  # lowest index any member still needs, learned from the leader
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_election_ticks = config.election_ticks
        self.tick_count = 0
        self._uncommitted: deque[tuple[int, int]] = deque()  # (last index, bytes) per proposal
        self.uncommitted_bytes = 0
        self._msgs: list[Message] = []
        # Inputs so far (tick, step, propose, advance, ...): the appends to send only change with
        # an input, so has_ready() and ready() do not look for them twice in between.
        self._inputs = 0
        self._appends_flushed_at = -1
        self.lazy_peers: frozenset[str] = frozenset()  # as leader with quorum_first: see leader.py
        self.snapshot = snapshot
        self.recovering = recovering
        # The last index an append of this term's leader proved our log matches its own: a
        # heartbeat commits no further (a match the leader recorded before we lost entries, or
        # entries another leader wrote since, must not be committed on its word).
        self.verified_index = 0
        if membership_at is None and snapshot is not None:
            membership_at = (snapshot.index, snapshot.membership)
        self._init_membership(membership_at)
        self._reset_election_timer()

    # ======================================================================================
    # inputs
    # ======================================================================================

    def tick(self) -> None:
        self._inputs += 1
        self.tick_count += 1
        self.election_elapsed += 1
        if self.role is Role.LEADER:
            self._tick_leader()
        elif self.log.pending_snapshot is not None or not self.may_campaign():
            # Its log is about to be replaced, or it is no voter: it does not campaign. (Its
            # election_elapsed still grows: it is how long since it heard from a leader, and
            # past an election timeout it answers others' (pre-)votes.)
            pass
        elif self.election_elapsed >= self.randomized_election_ticks:
            self.election_elapsed = 0
            self._start_election()

    def propose(self, data: bytes) -> tuple[int, int]:
        """Append data as a new entry on the leader; returns (term, index)."""
        return self.propose_batch((data,))[0]

    def propose_batch(self, items: Sequence[bytes]) -> list[tuple[int, int]]:
        self._inputs += 1
        if self.role is not Role.LEADER:
            raise NotLeaderError(self.leader_id, self.term)
        if self.transferee is not None:
            raise LeadershipTransferInProgressError(f"transferring leadership to {self.transferee}")
        size = sum(map(len, items)) + ENTRY_OVERHEAD_BYTES * len(items)  # as entries_bytes
        if self.uncommitted_bytes and self.uncommitted_bytes + size > self.config.max_uncommitted_bytes:
            raise OverloadedError(f"{self.uncommitted_bytes} bytes uncommitted")
        first = self.log.last_index() + 1
        n = len(items)
        entries = build_entries(range(first, first + n), itertools.repeat(self.term, n),
                                itertools.repeat(EntryKind.NORMAL, n), items)
        self._append_as_leader(entries, size)
        return [(self.term, e.index) for e in entries]

    def campaign(self) -> None:
        """Start an election now (as if the election timeout fired)."""
        self._inputs += 1
        if (self.role is not Role.LEADER and self.log.pending_snapshot is None
                and self.may_campaign()):
            self._start_election()

    def step(self, m: Message) -> None:
        self._inputs += 1
        if m.dst != self.id or not self._from_member(m):
            return
        if m.term > self.term:
            if not self._accept_higher_term(m):
                return
        elif m.term < self.term:
            self._on_lower_term(m)
            return
        handler = _HANDLERS[type(m)]
        handler(self, m)

    def _from_member(self, m: Message) -> bool:
        """A leader's messages and votes are taken from anyone (Raft dissertation 4.1: a node
        behind on membership changes must still follow a leader, and vote for a candidate, that
        it does not know as a member yet; the term rules, pre-vote and the leader lease keep a
        removed node from disrupting; a candidate counts only its voters' votes). Answers to a
        leader come from its members."""
        return isinstance(m, _FROM_ANYONE) or m.src in self.membership.member_set

    # ======================================================================================
    # output
    # ======================================================================================

    def has_ready(self) -> bool:
        self._flush_appends()
        return bool(
            self._msgs
            or self.log.unstable
            or self._hard_state_changed()
            or self.log.commit_index > self.log.handed_out_index
            or (self.log.pending_snapshot is not None and not self.log.snapshot_handed_out)
        )

    def ready(self) -> Ready:
        self._flush_appends()
        hs = None
        if self._hard_state_changed():
            self._pending_hard_state = HardState(self.term, self.voted_for)
            hs = self._hard_state_for_shell()
        snapshot = self._snapshot_for_shell()
        entries = tuple(self.log.unstable)
        committed = tuple(self.log.next_committed(self.config.max_apply_bytes))
        if committed:
            self.log.handed_out_index = committed[-1].index
        early: list[Message] = []
        late: list[Message] = []
        # A leader's appends and heartbeats do not depend on its own persistence (it counts
        # itself only after advance), so they may leave before the local fsync (Raft 10.2.1).
        early_kinds = _CANARY_EARLY if self.config.canaries.ack_before_fsync else _LEADER_EARLY
        for m in self._msgs:
            (early if hs is None and isinstance(m, early_kinds) else late).append(m)
        self._msgs = []
        return Ready(hs, entries, tuple(early), tuple(late), committed,
                     must_sync=hs is not None or bool(entries) or snapshot is not None,
                     snapshot=snapshot)

    def advance(self, rd: Ready, durable: bool = True) -> None:
        """The shell did what ``rd`` asked. ``durable=False`` (allowed only when
        ``can_defer_sync(rd)``): the entries are written but not yet fsynced; the shell calls
        ``mark_durable`` when they are."""
        self._inputs += 1
        if rd.hard_state is not None and self._pending_hard_state is not None:
            self._persisted_hard_state = self._pending_hard_state
            self._pending_hard_state = None
        if rd.snapshot is not None:
            self._snapshot_advanced(rd.snapshot)
        if rd.entries:
            first, last = rd.entries[0].index, rd.entries[-1].index
            if first <= self._written_index:  # the written suffix was replaced
                self.durable_index = min(self.durable_index, first - 1)
                self.write_generation += 1
            self._written_index = last
            self.log.stable_to(last)
            if durable:
                self.durable_index = last
            if self.role is Role.LEADER:
                self._maybe_commit()
        if rd.committed:
            self.log.applied_to(rd.committed[-1].index)
        self.log.release_cache_to(self._cache_floor())

    def _cache_floor(self) -> int:
        """The last entry no reader of the cache needs: applied here and, on a leader, matched
        by every peer (a lagging peer holds the cache up to its byte bound)."""
        if self.role is Role.LEADER:  # (every peer holds what is below the group's retain index)
            return min(self.log.applied_index, self._group_retain_index() - 1)
        return self.log.applied_index

    def can_defer_sync(self, rd: Ready) -> bool:
        """True if nothing in rd waits for the fsync of its entries: a leader's own appends
        (its copy is counted only once durable) with no hard-state change to persist."""
        return (self.role is Role.LEADER and rd.hard_state is None and rd.snapshot is None
                and not self.config.canaries.ack_before_fsync
                and all(isinstance(m, _LEADER_EARLY) for m in rd.messages))

    def mark_durable(self, index: int, term: int, generation: int) -> None:
        """Entries up to (index, term), written under ``generation``, are now fsynced."""
        self._inputs += 1
        if generation != self.write_generation or index <= self.durable_index:
            return
        if index > self.log.last_index() or self.log.term_at(index) != term:
            return
        self.durable_index = index
        if self.role is Role.LEADER:
            self._maybe_commit()

    def status(self) -> Status:
        followers = tuple(
            FollowerStatus(
                node_id=peer,
                match_index=pr.match_index,
                next_index=pr.next_index,
                state=pr.state.value,
                last_contact_ticks=(self.tick_count - pr.last_contact_tick
                                    if pr.last_contact_tick >= 0 else -1),
                in_flight=len(pr.inflight),
            )
            for peer, pr in sorted(self.progress.items())
        )
        return Status(
            node_id=self.id, role=self.role, term=self.term, leader_id=self.leader_id,
            voted_for=self.voted_for, first_index=self.log.first_index(),
            last_index=self.log.last_index(), commit_index=self.log.commit_index,
            applied_index=self.log.applied_index, persisted_index=self._self_match_index(),
            retain_index=self.safe_retain_index(), transferee=self.transferee,
            followers=followers, snapshot_index=self.snapshot.index if self.snapshot else 0,
            voters=self.membership.voters, learners=self.membership.learners,
            config_index=self.config_index,
            config_pending=self.config_index > self.log.commit_index,
        )

    def safe_retain_index(self) -> int:
        """Entries below this index may be deleted by retention on this node: every member
        has them (as far as this node knows) and they are applied here."""
        floor = min(self.log.applied_index + 1, self._self_match_index() + 1)
        if self.role is Role.LEADER:
            return min(floor, self._group_retain_index())
        return min(floor, self.retain_index)

    # ======================================================================================
    # handlers: replication (follower side)
    # ======================================================================================

    def _on_append_request(self, m: AppendRequest) -> None:
        self._follow(m.src)
        log = self.log
        if m.prev_log_index < log.commit_index:
            # Everything up to our commit index already matches; answer where we are.
            self.verified_index = max(self.verified_index, log.commit_index)
            self._send(AppendResponse(self.term, self.id, m.src, True, log.commit_index))
            return
        if not log.match_term(m.prev_log_index, m.prev_log_term):
            hint = log.last_index_with_term_at_most(min(m.prev_log_index, log.last_index()),
                                                    m.prev_log_term)
            self._send(AppendResponse(self.term, self.id, m.src, False, m.prev_log_index,
                                      conflict_term=log.term_at(hint), conflict_index=hint))
            return
        last_new = m.prev_log_index + len(m.entries)
        if self.config.canaries.truncate_on_append and m.entries:
            conflict = m.entries[0].index
        else:
            conflict = log.find_conflict(m.entries)
        if conflict:
            # Only entries that disagree with the leader are cut: a stale or reordered append
            # whose entries all match never truncates what we already have.
            assert conflict > log.commit_index or self.config.canaries.truncate_on_append, \
                f"{self.id}: conflict at {conflict} <= commit {log.commit_index}"
            new = m.entries[conflict - m.entries[0].index:]
            self._note_cut(conflict)
            log.append(new)
            if self._note_configs(new):
                self._membership_changed()
        log.commit_to(min(m.leader_commit, last_new))
        self.verified_index = max(self.verified_index, last_new)
        if self.recovering and log.commit_index >= m.leader_commit:
            # Caught up with everything its leader has committed, which covers whatever it
            # acknowledged before it lost its disk: its vote means something again.
            self.recovering = False
        self._send(AppendResponse(self.term, self.id, m.src, True, last_new))

    def _on_heartbeat(self, m: Heartbeat) -> None:
        self._follow(m.src)
        log = self.log
        known = max(self.verified_index, log.commit_index)
        log.commit_to(min(m.commit, known))
        if m.retain_index > self.retain_index:
            self.retain_index = m.retain_index
        # Past ``known``, the leader counts on entries no append of its own has shown us to hold
        # (we restarted, or lost them with a disk or a page cache): we ask for an append, which
        # proves them (and commits them) or is refused (and the leader repairs our log).
        self._send(HeartbeatResponse(self.term, self.id, m.src, unverified=m.commit > known))

    # ======================================================================================
    # plumbing
    # ======================================================================================

    def _send(self, m: Message) -> None:
        self._msgs.append(m)

    def _hard_state_changed(self) -> bool:
        hs = self._persisted_hard_state
        return hs.term != self.term or hs.voted_for != self.voted_for

    def _hard_state_for_shell(self) -> HardState:
        if self.config.canaries.forget_vote:
            return HardState(self.term, None)
        return HardState(self.term, self.voted_for)


# Each handler takes the message type it is filed under (hence Any: a dict cannot say that).
_HANDLERS: dict[type, Callable[[RaftCore, Any], None]] = {
    VoteRequest: RaftCore._on_vote_request,
    VoteResponse: RaftCore._on_vote_response,
    AppendRequest: RaftCore._on_append_request,
    AppendResponse: RaftCore._on_append_response,
    Heartbeat: RaftCore._on_heartbeat,
    HeartbeatResponse: RaftCore._on_heartbeat_response,
    TimeoutNow: RaftCore._on_timeout_now,
    InstallSnapshot: RaftCore._on_install_snapshot,
}
