"""The simulator's observer: Raft's safety invariants, checked from outside the nodes after every
event (and at every Ready, before the shell persists anything).

Owns the global record of what was ever committed, applied, voted and led, and raises
``Violation`` naming the broken invariant. It only reads node state; it never changes it.
"""

from __future__ import annotations

from chaos.sim.node import SimNode, Violation
from dledger.raft.types import Entry, Ready, Role, SnapshotMeta


def durably_holds(node: SimNode, index: int, term: int | None) -> bool:
    """Whether node's disk holds entry index of the given term for good: retention only ever
    deletes durable, committed entries, so a retained-away index counts as held."""
    if index < node.store.first_index():
        return True
    return term is not None and node.store.durable_term_at(index) == term


def majority_of(voters: tuple[str, ...]) -> int:
    return len(voters) // 2 + 1


class Observer:
    """With membership changes, "a majority" is one of the voters of the membership under which
    an entry was committed: the leader's that first counted it committed (a leader uses the
    latest membership in its log, committed or not). With single-server changes that majority
    meets every majority of the membership before it and of the one after, so no later leader
    can lack the entry."""

    def __init__(self) -> None:
        self.committed_voters: list[tuple[str, ...]] = [()]  # [i]: voters that committed i
        self.leader_of_term: dict[int, str] = {}
        self.leader_last: dict[tuple[str, int], tuple[int, int]] = {}  # (node, term) -> (index, term)
        self.chain_of: dict[tuple[int, int], int] = {}  # (index, term) -> prefix hash
        self.committed_chain: list[int] = [0]  # committed_chain[i]: prefix hash of committed i
        self.applied_at: dict[int, tuple[int, bytes]] = {}
        self.vote_of: dict[tuple[str, int], str] = {}
        self.max_term_of: dict[str, int] = {}
        self.last_commit_of: dict[str, int] = {}
        self.checks = 0

    # -- hooks called by the world -------------------------------------------------------------

    def on_appended(self, node: SimNode, entries: tuple[Entry, ...]) -> None:
        """Log Matching: one (index, term) pair always names the same prefix, on every node."""
        for e in entries:
            h = node.chain_at(e.index)
            known = self.chain_of.setdefault((e.index, e.term), h)
            if known != h:
                raise Violation("LogMatching", f"{node.id} holds ({e.index}, term {e.term}) "
                                               f"with a different prefix than another node")

    def on_ready(self, node: SimNode, rd: Ready) -> None:
        """Checked before the shell persists anything: a crash could happen right now. A leader's
        commit index is recorded here (its appends carry it out before a crash could stop it)."""
        if node.core.role is Role.LEADER:
            self._check_committed_prefix(node, node.core.log.commit_index)
        else:
            self._check_committed_is_durable(node, node.core.log.commit_index)

    def on_apply(self, node: SimNode, e: Entry, expected_index: int) -> None:
        if e.index != expected_index:
            raise Violation("StateMachineSafety", f"{node.id} applied {e.index}, "
                                                  f"expected {expected_index}")
        known = self.applied_at.setdefault(e.index, (e.term, e.data))
        if known != (e.term, e.data):
            raise Violation("StateMachineSafety", f"{node.id} applied a different entry at "
                                                  f"{e.index}: term {e.term} vs {known[0]}")

    def on_install(self, node: SimNode, meta: SnapshotMeta, chain: list[int]) -> None:
        """A snapshot holds committed state only, the one every node committed; installing it
        never takes a node's state machine back."""
        top = len(self.committed_chain) - 1
        if meta.index > top or len(chain) != meta.index:
            raise Violation("SnapshotSafety", f"{node.id} installs a snapshot at {meta.index} "
                                              f"past the committed {top}")
        if meta.index and chain[-1] != self.committed_chain[meta.index]:
            raise Violation("SnapshotSafety", f"{node.id} installs a snapshot at {meta.index} "
                                              f"whose state is not the committed one")
        if meta.index < node.applied_index:
            raise Violation("StateMachineSafety", f"{node.id} installs a snapshot at "
                                                  f"{meta.index}, below its applied index "
                                                  f"{node.applied_index}")

    def on_restart(self, node: SimNode) -> None:
        before = self.max_term_of.get(node.id, 0)
        if node.core.term < before:
            raise Violation("TermMonotonic", f"{node.id} restarted at term {node.core.term} "
                                             f"after reaching term {before}")
        self.last_commit_of.pop(node.id, None)

    def after_event(self, nodes: list[SimNode], changed: SimNode | None = None) -> None:
        """``changed``: the one node the event acted on (None: any of them may have changed)."""
        self.checks += 1
        for node in nodes if changed is None else (changed,):
            if node.up:
                self._check_node(node)
        self._check_top_committed_durable(nodes)

    def _check_top_committed_durable(self, nodes: list[SimNode]) -> None:
        """The newest committed entry stays on a majority of disks, whatever crashes since."""
        top = len(self.committed_chain) - 1
        voters = self.committed_voters[top]
        if top == 0 or not voters:
            return
        chain, missing = self.committed_chain[top], majority_of(voters)
        for n in nodes:  # (until a majority is found: this runs after every event)
            if n.id in voters and n.chain_at(top) == chain \
                    and durably_holds(n, top, n.store.durable_term_at(top)):
                missing -= 1
                if not missing:
                    return
        held = majority_of(voters) - missing
        raise Violation("CommittedIsDurable", f"committed entry {top} is durable on "
                                              f"{held} of the voters {voters} only")

    # -- invariants ---------------------------------------------------------------------------

    def _check_node(self, node: SimNode) -> None:
        core = node.core
        nid, term = node.id, core.term
        if term < self.max_term_of.get(nid, 0):
            raise Violation("TermMonotonic", f"{nid} term went back to {term}")
        self.max_term_of[nid] = term
        if core.voted_for is not None:
            prior = self.vote_of.setdefault((nid, term), core.voted_for)
            if prior != core.voted_for:
                raise Violation("OneVotePerTerm", f"{nid} voted for {prior} and "
                                                  f"{core.voted_for} in term {term}")
        commit = core.log.commit_index
        if core.role is Role.LEADER:
            self._check_leader(node)
            prior_commit = self.last_commit_of.get(nid, 0)
            if commit > prior_commit and core.log.term_at(commit) != term:
                # Raft 5.4.2: a leader moves its commit index only to an entry of its own term
                # (earlier entries commit with it), never to an older entry by counting copies.
                raise Violation("CurrentTermCommit", f"{nid} (term {term}) committed up to "
                                                     f"{commit} of term {core.log.term_at(commit)}")
        if commit > core.log.last_index():
            raise Violation("CommitBounded", f"{nid} commit {commit} > last {core.log.last_index()}")
        if commit < self.last_commit_of.get(nid, 0):
            raise Violation("CommitMonotonic", f"{nid} commit went back to {commit}")
        self.last_commit_of[nid] = commit
        self._check_committed_prefix(node, commit)

    def _check_leader(self, node: SimNode) -> None:
        core = node.core
        first = self.leader_of_term.setdefault(core.term, node.id)
        if first != node.id:
            raise Violation("ElectionSafety", f"{first} and {node.id} both lead term {core.term}")
        key = (node.id, core.term)
        last = core.log.last_index()
        if key not in self.leader_last:
            # Leader Completeness: a new leader holds every entry committed so far.
            top = len(self.committed_chain) - 1
            if top > 0 and (last < top or node.chain_at(top) != self.committed_chain[top]):
                raise Violation("LeaderCompleteness", f"{node.id} leads term {core.term} "
                                                      f"without committed entry {top}")
        else:
            prev_index, prev_term = self.leader_last[key]
            retained = prev_index < core.log.first_index() - 1
            if last < prev_index or (not retained and core.log.term_at(prev_index) != prev_term):
                raise Violation("LeaderAppendOnly", f"{node.id} (term {core.term}) rewrote "
                                                    f"its log at or before {prev_index}")
        self.leader_last[key] = (last, core.log.term_at(last))

    def _check_committed_prefix(self, node: SimNode, commit: int) -> None:
        if commit == 0:
            return
        top = len(self.committed_chain) - 1
        if commit <= top:
            if node.chain_at(commit) != self.committed_chain[commit]:
                raise Violation("CommittedPrefixStable", f"{node.id} committed a different "
                                                         f"entry at {commit}")
            return
        if top > 0 and node.chain_at(top) != self.committed_chain[top]:
            raise Violation("CommittedPrefixStable", f"{node.id} diverges below commit {top}")
        # (the first to count an index committed is its leader: followers learn it from one)
        voters = node.core.voters if node.core.role is Role.LEADER \
            else node.core.membership_at(commit).voters
        for i in range(top + 1, commit + 1):
            self.committed_chain.append(node.chain_at(i))
            self.committed_voters.append(voters)
        self._check_committed_is_durable(node, commit)

    def _check_committed_is_durable(self, node: SimNode, commit: int) -> None:
        """Acknowledged means durable: the newest entry a node counts as committed is on a
        majority of disks (checked at every Ready too, where a crash could strike next)."""
        if commit == 0 or commit < node.core.log.first_index():
            return
        if commit < len(self.committed_voters):
            voters = self.committed_voters[commit]
        elif node.core.role is Role.LEADER:
            voters = node.core.voters  # (about to be recorded: it is the first to count it)
        else:
            voters = node.core.membership_at(commit).voters
        if not voters:
            return
        term = node.core.log.term_at(commit)
        holders = sum(1 for n in node.world.nodes
                      if n.id in voters and durably_holds(n, commit, term))
        if holders < majority_of(voters):
            raise Violation("CommittedIsDurable", f"{node.id} counts entry {commit} (term {term}) "
                                                  f"as committed; it is durable on {holders} of "
                                                  f"the voters {voters}")
