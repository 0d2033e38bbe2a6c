"""Elections and the term rules of a Raft node (``ElectionRole``, a part of ``RaftCore``): the
election timer, becoming follower, pre-candidate, candidate or leader (a new leader appends its
term's no-op, Raft section 8), asking for votes and counting them, the rules for a message of a
higher or lower term (a leader heard within the election timeout is not deposed by a disruptive
candidate: check-quorum's lease), and answering votes and TimeoutNow. Pure, as the core is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dledger.raft.config import RaftConfig
from dledger.raft.log import RaftLog
from dledger.raft.progress import Progress
from dledger.raft.quorum import VoteResult, vote_result
from dledger.raft.types import (
    AppendRequest,
    Entry,
    EntryKind,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    Role,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)

if TYPE_CHECKING:  # the core only uses the Random instance it is given, never the global one
    import random

__all__ = ["ElectionRole"]

_FROM_LEADER = (AppendRequest, Heartbeat, InstallSnapshot)


class ElectionRole:
    # State owned by RaftCore (declared here for the type checker).
    config: RaftConfig
    id: str
    rng: random.Random
    log: RaftLog
    role: Role
    term: int
    voted_for: str | None
    leader_id: str | None
    votes: dict[str, bool]
    progress: dict[str, Progress]
    transferee: str | None
    term_start_index: int
    election_elapsed: int
    heartbeat_elapsed: int
    randomized_election_ticks: int
    verified_index: int
    recovering: bool
    lazy_peers: frozenset[str]

    if TYPE_CHECKING:  # (provided by RaftCore and its other parts; no stubs at run time, which
        # would hide them: this part comes first among RaftCore's bases)
        def _send(self, m: Message) -> None: ...

        def _clear_uncommitted(self) -> None: ...

        def _append_as_leader(self, entries: Sequence[Entry], size: int | None = None) -> None: ...

        @property
        def peers(self) -> tuple[str, ...]: ...

        def vote_peers(self) -> tuple[str, ...]: ...

        def tally_voters(self) -> tuple[str, ...]: ...

        def may_campaign(self) -> bool: ...

    # ======================================================================================
    # roles
    # ======================================================================================

    def _reset_election_timer(self) -> None:
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        n = self.config.election_ticks
        self.randomized_election_ticks = n + self.rng.randrange(n)

    def _become_follower(self, term: int, leader_id: str | None) -> None:
        if term != self.term:
            self.term = term
            self.voted_for = None
            self.verified_index = 0
        self.role = Role.FOLLOWER
        self.leader_id = leader_id
        self.transferee = None
        self.progress = {}
        self.votes = {}
        self._clear_uncommitted()
        self._reset_election_timer()

    def _become_pre_candidate(self) -> None:
        self.role = Role.PRE_CANDIDATE
        self.leader_id = None
        self.votes = {self.id: True}
        self._reset_election_timer()

    def _become_candidate(self) -> None:
        self.term += 1
        self.voted_for = self.id
        self.role = Role.CANDIDATE
        self.leader_id = None
        self.votes = {self.id: True}
        self._reset_election_timer()

    def _become_leader(self) -> None:
        self.role = Role.LEADER
        self.leader_id = self.id
        self.votes = {}
        self.transferee = None
        self._reset_election_timer()
        nxt = self.log.last_index() + 1
        self.progress = {p: Progress(nxt, self.config.max_inflight) for p in self.peers}
        self.lazy_peers = frozenset()  # every follower gets every entry until the first pick
        self._clear_uncommitted()
        # Raft 8: a no-op of the new term lets the leader learn (and commit) what is committed.
        self.term_start_index = nxt
        self._append_as_leader([Entry(nxt, self.term, EntryKind.NOOP, b"")])
        self.recovering = False  # (elected with an empty log: a group's first leader)

    def _start_election(self, transfer: bool = False) -> None:
        if self.config.pre_vote and not transfer:
            self._become_pre_candidate()
            self._request_votes(pre_vote=True, transfer=False)
        else:
            self._become_candidate()
            self._request_votes(pre_vote=False, transfer=transfer)

    def _request_votes(self, pre_vote: bool, transfer: bool) -> None:
        if self._tally() is VoteResult.WON:  # a group of one
            self._on_election_won(pre_vote)
            return
        term = self.term + 1 if pre_vote else self.term
        last_index = self.log.last_index()
        last_term = self.log.last_term()
        for peer in self.vote_peers():
            self._send(VoteRequest(term, self.id, peer, last_index, last_term, pre_vote, transfer))

    def _tally(self) -> VoteResult:
        return vote_result(self.tally_voters(), self.votes)

    def _on_election_won(self, pre_vote: bool) -> None:
        if pre_vote:
            self._become_candidate()
            self._request_votes(pre_vote=False, transfer=False)
        else:
            self._become_leader()

    # ======================================================================================
    # term rules
    # ======================================================================================

    def _accept_higher_term(self, m: Message) -> bool:
        """A message from a higher term. Returns False if it must be ignored."""
        if isinstance(m, VoteRequest):
            in_lease = (self.config.check_quorum and self.leader_id is not None
                        and self.election_elapsed < self.config.election_ticks)
            if in_lease and not m.transfer:
                # We heard from a live leader within the election timeout: a disruptive
                # candidate (e.g. a rejoining partitioned node) must not depose it.
                return False
            if m.pre_vote:
                return True  # answering a pre-vote never changes our term
        if isinstance(m, VoteResponse) and m.pre_vote and m.granted:
            return True  # granted pre-votes carry the term we are about to campaign in
        leader = m.src if isinstance(m, _FROM_LEADER) else None
        self._become_follower(m.term, leader)
        return True

    def _on_lower_term(self, m: Message) -> None:
        if isinstance(m, _FROM_LEADER):
            # Tell a stale leader about the newer term so it steps down.
            self._send(HeartbeatResponse(self.term, self.id, m.src))
        elif isinstance(m, VoteRequest) and m.pre_vote:
            self._send(VoteResponse(self.term, self.id, m.src, granted=False, pre_vote=True))

    # ======================================================================================
    # handlers: elections
    # ======================================================================================

    def _on_vote_request(self, m: VoteRequest) -> None:
        can_vote = (
            self.voted_for == m.src
            or (self.voted_for is None and self.leader_id is None)
            or (m.pre_vote and m.term > self.term)
        )
        if self.recovering and m.last_log_index > 0:
            can_vote = False  # (see recovering in __init__)
        if can_vote and self.log.is_up_to_date(m.last_log_index, m.last_log_term):
            self._send(VoteResponse(m.term, self.id, m.src, granted=True, pre_vote=m.pre_vote))
            if not m.pre_vote:
                self.voted_for = m.src
                self.election_elapsed = 0
        else:
            self._send(VoteResponse(self.term, self.id, m.src, granted=False, pre_vote=m.pre_vote))

    def _on_vote_response(self, m: VoteResponse) -> None:
        expected = Role.PRE_CANDIDATE if m.pre_vote else Role.CANDIDATE
        if self.role is not expected:
            return
        # A pre-vote grant names the term we would campaign in (ours + 1); a grant of an
        # earlier round (same number as our term now) must not count towards this one.
        if m.pre_vote and m.granted and m.term != self.term + 1:
            return
        self.votes[m.src] = m.granted
        result = self._tally()
        if result is VoteResult.WON:
            self._on_election_won(m.pre_vote)
        elif result is VoteResult.LOST:
            self._become_follower(self.term, None)

    def _on_timeout_now(self, m: TimeoutNow) -> None:
        if self.role is not Role.LEADER and self.may_campaign():
            self._start_election(transfer=True)

    def _follow(self, leader_id: str) -> None:
        if self.role is not Role.FOLLOWER:
            self._become_follower(self.term, leader_id)
        self.leader_id = leader_id
        self.election_elapsed = 0
