"""Membership changes in the Raft core: single-server changes (Raft dissertation section 4.1), with
learners. A mixin of ``RaftCore`` (core.py), pure like it.

Why single-server changes rather than joint consensus: the majorities of two configurations that
differ by one voter always overlap, so a configuration is in force as soon as a node appends it
(committed or not), with no intermediate joint configuration to get right; what an operator
needs (grow 3 to 5 one node at a time, replace a node by adding the new then removing the old)
is a sequence of single changes. The rules kept here:
- a node uses the latest membership in its log, committed or not; a truncation that removes a
  membership entry restores the one before it; a snapshot brings the membership at its index;
- a leader proposes a change only when the previous one is committed and it has committed an
  entry of its own term (the fix to the single-server algorithm in the dissertation's errata);
- one voter added or removed per change; a voter is added only by promoting a learner that has
  caught up (streaming, within one lazy batch of the commit index), so that a new voter does
  not stall commits while it fetches the log (safety does not rest on this: availability does);
- only voters vote, campaign, and count for commits and check-quorum; learners get the log;
- a leader that removed itself keeps leading until that change commits, then steps down; a node
  whose latest membership removes it, not committed yet, still campaigns (counting the new
  voters' votes only, not its own): it may hold the only copy of that change, without which
  the others cannot elect a leader (they need its vote, and it has the longer log).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dledger.raft.config import RaftConfig
from dledger.raft.log import RaftLog
from dledger.raft.progress import Progress, ProgressState
from dledger.raft.types import Entry, EntryKind, Membership, Role, SnapshotMeta
from protocol.errors import LeadershipTransferInProgressError, MembershipChangeError, NotLeaderError


class MembershipRole:
    # State owned by RaftCore (declared here for the type checker).
    config: RaftConfig
    id: str
    log: RaftLog
    role: Role
    term: int
    leader_id: str | None
    progress: dict[str, Progress]
    transferee: str | None
    term_start_index: int
    _inputs: int

    if TYPE_CHECKING:  # (provided by the other parts of RaftCore)
        def _append_as_leader(self, entries: Sequence[Entry], size: int | None = None) -> None:
            ...

        def _become_follower(self, term: int, leader_id: str | None) -> None:
            ...

    # -- the membership in force -------------------------------------------------------------

    def _init_membership(self, base: tuple[int, Membership] | None) -> None:
        """The membership as of index ``base[0]`` (a snapshot's, or the one saved with it; None:
        the configured one, as of the start of the log), then every change the log holds after
        it."""
        forget = self.config.canaries.membership_forget_on_restart
        if base is None or forget:
            initial = Membership(()) if self.config.join else Membership(self.config.voters)
            base = (0, initial)
        self._base_membership = base
        self._configs: list[tuple[int, Membership]] = []  # membership entries past the base
        lo, hi = max(self.log.first_index(), base[0] + 1), self.log.last_index()
        if forget:
            lo = hi + 1
        while lo <= hi:
            batch = self.log.stable.entries(lo, hi + 1, 4 << 20)
            self._note_configs(batch)
            lo = batch[-1].index + 1
        self.membership = self._configs[-1][1] if self._configs else base[1]

    @property
    def voters(self) -> tuple[str, ...]:
        return self.membership.voters

    def may_campaign(self) -> bool:
        """A voter, or a voter being removed by a change not committed yet."""
        if self.id in self.membership.voters:
            return True
        return (self.config_index > self.log.commit_index
                and self.id in self.membership_at(self.log.commit_index).voters)

    @property
    def peers(self) -> tuple[str, ...]:
        """Every other member (voters and learners): the leader replicates to them."""
        return tuple(p for p in self.membership.members if p != self.id)

    @property
    def quorum(self) -> int:
        return len(self.membership.voters) // 2 + 1

    def vote_peers(self) -> tuple[str, ...]:
        """The voters a candidate asks (the canary also asks voters it no longer has)."""
        voters = self.tally_voters()
        return tuple(v for v in voters if v != self.id)

    def tally_voters(self) -> tuple[str, ...]:
        if self.config.canaries.membership_count_removed:
            return tuple(sorted(set(self.membership.voters) | set(self.config.voters)))
        return self.membership.voters

    @property
    def config_index(self) -> int:
        return self._configs[-1][0] if self._configs else self._base_membership[0]

    def membership_at(self, index: int) -> Membership:
        """The membership in force at ``index`` (at or after the base this node knows)."""
        found = self._base_membership[1]
        for at, m in self._configs:
            if at > index:
                break
            found = m
        return found

    # -- changes from the log ------------------------------------------------------------------

    def _note_configs(self, entries: Sequence[Entry]) -> bool:
        """Entries were appended: take up the memberships among them. True if one was."""
        changed = False
        for e in entries:
            if e.kind is EntryKind.CONFIG:
                try:
                    m = Membership.decode(e.data)
                except ValueError:
                    continue  # (every node reads the same bytes: all ignore it alike)
                self._configs.append((e.index, m))
                changed = True
        if changed:
            self.membership = self._configs[-1][1]
        return changed

    def _note_cut(self, from_index: int) -> None:
        """Entries from ``from_index`` on were cut: memberships among them are no longer."""
        if self._configs and self._configs[-1][0] >= from_index:
            self._configs = [c for c in self._configs if c[0] < from_index]
            self.membership = self._configs[-1][1] if self._configs else self._base_membership[1]
            self._membership_changed()

    def _note_restored(self, meta: SnapshotMeta) -> None:
        self._base_membership = (meta.index, meta.membership)
        self._configs = []
        self.membership = meta.membership
        self._membership_changed()

    def _membership_changed(self) -> None:
        """As leader: replicate to exactly the members (new ones probed from the log's end)."""
        if self.role is not Role.LEADER:
            return
        members = set(self.peers)
        for gone in [p for p in self.progress if p not in members]:
            del self.progress[gone]
        nxt = self.log.last_index() + 1
        for p in members - set(self.progress):
            self.progress[p] = Progress(nxt, self.config.max_inflight)
        if self.transferee is not None and self.transferee not in self.voters:
            self.transferee = None

    def _membership_committed(self) -> None:
        """The commit index moved: a leader that is no longer a voter leaves once that is
        committed (its last duty was to commit the change)."""
        if (self.role is Role.LEADER and self.id not in self.membership.voters
                and self.config_index <= self.log.commit_index):
            self._become_follower(self.term, None)

    # -- proposing a change ------------------------------------------------------------------

    def propose_membership(self, new: Membership) -> tuple[int, int]:
        """Append a new membership as the leader (the rules in the module docstring); returns
        its (term, index). MembershipChangeError names the rule a change breaks."""
        self._inputs += 1
        if self.role is not Role.LEADER:
            raise NotLeaderError(self.leader_id, self.term)
        if self.transferee is not None:
            raise LeadershipTransferInProgressError(f"transferring leadership to {self.transferee}")
        self._check_change(self.membership, new)
        index = self.log.last_index() + 1
        entry = Entry(index, self.term, EntryKind.CONFIG, new.encode())
        self._append_as_leader([entry])
        self._note_configs([entry])
        self._membership_changed()
        return self.term, index

    def _check_change(self, old: Membership, new: Membership) -> None:
        canaries = self.config.canaries
        if not canaries.membership_two_at_once and self.config_index > self.log.commit_index:
            raise MembershipChangeError(f"the change at index {self.config_index} is not "
                                        f"committed yet: one change at a time")
        if self.log.commit_index < self.term_start_index:
            raise MembershipChangeError("this leader has not committed an entry of its term yet")
        ids = [*new.voters, *new.learners]
        if not new.voters or len(set(ids)) != len(ids) or not all(ids):
            raise MembershipChangeError("a membership needs at least one voter and no member "
                                        "twice")
        added = set(new.voters) - set(old.voters)
        removed = set(old.voters) - set(new.voters)
        if len(added) + len(removed) > 1:
            raise MembershipChangeError(f"one voter at a time: {sorted(added)} added and "
                                        f"{sorted(removed)} removed at once")
        for v in added:
            pr = self.progress.get(v)
            if v not in old.learners or pr is None:
                raise MembershipChangeError(f"{v} must join as a learner before it votes")
            behind = self.log.commit_index - pr.match_index
            if pr.state is not ProgressState.REPLICATE or behind > self.config.lazy_batch_entries:
                raise MembershipChangeError(f"learner {v} has not caught up (it holds up to "
                                            f"{pr.match_index}, commit {self.log.commit_index})")

    def membership_status(self) -> tuple[tuple[str, ...], tuple[str, ...], int, bool]:
        """(voters, learners, index of the membership in force, whether it is uncommitted)."""
        m = self.membership
        return m.voters, m.learners, self.config_index, self.config_index > self.log.commit_index

