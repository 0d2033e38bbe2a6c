"""What a node tells its operators in its log at INFO as it runs (``NodeEventLog``), from what the
shell observes after each turn (the Raft core is pure and never logs): elections and leader
changes with their terms, membership changes, retention's deletions, and slow fsyncs (over
``--slow-fsync-ms``, rate-limited: ``protocol.log_summary``). Snapshots and a full disk are logged
where they happen (``dledger.snapshots.shell``, ``dledger.node.disk_full``).

Quiet in steady state: a line only when the role, the term, the leader, the vote or the
membership changes, never per message, heartbeat or append. A pre-vote (which changes no term)
is logged at DEBUG only, so that a partitioned node does not write a line per election timeout.
"""

from __future__ import annotations

import logging

from dledger.raft.types import Membership, Role
from protocol.log_summary import EventSummary

__all__ = ["NodeEventLog"]

log = logging.getLogger("dledger.node")


class NodeEventLog:
    """The node's INFO lines about its role, term, leader, vote and membership (``observe``,
    ``observe_membership``), retention (``retained``) and slow fsyncs (``fsync_done``)."""

    def __init__(self, node_id: str, slow_fsync_s: float = 0.5) -> None:
        self.node_id = node_id
        self.slow_fsync_s = slow_fsync_s
        self.slow_fsyncs = EventSummary(
            logging.getLogger("dledger.storage"), f"slow fsyncs (over {slow_fsync_s * 1000:g} ms)",
            worst=lambda s: f"slowest {s * 1000:.0f} ms")
        self._role: Role | None = None
        self._term = -1  # (-1: nothing observed yet)
        self._leader: str | None = None
        self._vote: str | None = None
        self._members: tuple[tuple[str, ...], tuple[str, ...]] | None = None

    def observe(self, role: Role, term: int, leader: str | None, voted_for: str | None) -> None:
        """After a turn: log what changed since the last one."""
        if (role is self._role and term == self._term and leader == self._leader
                and voted_for == self._vote):
            return  # (every turn of a steady state)
        first = self._term < 0
        old_term, old_role, old_leader, old_vote = self._term, self._role, self._leader, self._vote
        self._role, self._term, self._leader, self._vote = role, term, leader, voted_for
        if first:
            log.info("at term %d as %s%s%s", term, role.value,
                     f", leader {leader}" if leader else "",
                     f", voted for {voted_for}" if voted_for else "",
                     extra={"role": role.value, "leader": leader})
            return
        if role is Role.PRE_CANDIDATE:  # (the leader it knew stays: a failed pre-vote, back
            self._leader = old_leader  # to following it, writes no line)
            log.debug("pre-vote at term %d", term)
            return
        new_term = term != old_term
        if new_term and role is Role.CANDIDATE:
            log.info("election at term %d: this node stands for leader (term was %d, leader %s)",
                     term, old_term, old_leader or "unknown",
                     extra={"role": role.value, "election_term": term})
        elif new_term and leader is None:
            log.info("election at term %d: %s (term was %d, leader %s)", term,
                     f"voted for {voted_for}" if voted_for else "no vote given from this node",
                     old_term, old_leader or "unknown",
                     extra={"role": role.value, "election_term": term, "voted_for": voted_for})
        elif not new_term and voted_for != old_vote and voted_for not in (None, self.node_id):
            log.info("election at term %d: voted for %s", term, voted_for,
                     extra={"election_term": term, "voted_for": voted_for})
        if leader is not None and (leader != old_leader or new_term):
            if leader == self.node_id:
                log.info("leader is %s: this node won the election at term %d", leader, term,
                         extra={"leader": leader, "election_term": term, "role": role.value})
            else:
                log.info("leader is %s, elected at term %d; this node is a %s", leader, term,
                         role.value, extra={"leader": leader, "election_term": term,
                                            "role": role.value})
        elif leader is None and old_leader is not None and not new_term:
            log.info("no leader at term %d: %s%s", term,
                     "this node stepped down" if old_role is Role.LEADER else
                     f"{old_leader} is no longer followed", "" if role is Role.FOLLOWER
                     else f" (now {role.value})", extra={"role": role.value})

    def observe_membership(self, m: Membership, index: int, pending: bool) -> None:
        """The membership in force (once per change: the shell calls this when it changes)."""
        members = (tuple(m.voters), tuple(m.learners))
        if members == self._members:
            return
        first, self._members = self._members is None, members
        log.info("%s: voters %s%s (log index %d%s)", "membership" if first else "membership changed",
                 ", ".join(m.voters) or "none",
                 f"; learners {', '.join(m.learners)}" if m.learners else "", index,
                 ", not committed yet" if pending else "",
                 extra={"voters": ",".join(m.voters), "learners": ",".join(m.learners)})

    @staticmethod
    def retained(first_before: int, first_after: int) -> None:
        """Retention deleted the entries ``first_before .. first_after - 1``."""
        if first_after > first_before:
            log.info("retention deleted log entries %d..%d (%d entries); the log starts at %d",
                     first_before, first_after - 1, first_after - first_before, first_after,
                     extra={"entries_deleted": first_after - first_before})

    def fsync_done(self, seconds: float) -> None:
        """A group commit took ``seconds``: counted in the slow-fsync summary if over the bar."""
        if seconds >= self.slow_fsync_s:
            self.slow_fsyncs.note("fsync", value=seconds)
