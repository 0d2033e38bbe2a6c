"""The checker of access control (``broker.features.acl.model``) over a recorded history: the
permission changes an admin made (when each was acknowledged) and the sends an account attempted on
a topic (when each began, how it ended).

Judged, for a send that began after a change was acknowledged and ended before the next change
began (a send overlapping a change, at either end, may see either side: one that began before
the next change began may reach the leader after it was applied):
- a send acknowledged although the permission in force denied PUB: an ACL change lost (a new
  leader that never learnt it, a replica that applied another table);
- a send refused for access (ACCESS_DENIED, or an unknown account) although the permission in
  force granted PUB.
Sends that failed otherwise (a leader change, a timeout) are counted, not judged.

Pure: the history is data; the test or the chaos run records it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LINES_MAX = 10


@dataclass(frozen=True, slots=True)
class PermChange:
    began_s: float  # monotonic, when the admin's request left
    acked_s: float  # when its answer (committed) arrived
    pub: bool  # whether the account may send to the topic from then on


@dataclass(frozen=True, slots=True)
class SendAttempt:
    began_s: float  # monotonic, when the send was called
    ended_s: float  # when its outcome was known
    outcome: str  # "ok", "denied" (ACCESS_DENIED, SIGNATURE_REFUSED) or "failed" (anything else)


@dataclass
class AclVerdict:
    judged: int
    unjudged: int  # overlapping a change, or failed for another reason
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def lines(self) -> list[str]:
        return [f"acl: {v}" for v in self.violations[:LINES_MAX]]


def check_acl(changes: list[PermChange], sends: list[SendAttempt]) -> AclVerdict:
    """Each send judged against the change in force from its start to its end (changes are
    sequential); one that overlaps a change is counted, not judged."""
    ordered = sorted(changes, key=lambda c: c.began_s)
    verdict = AclVerdict(0, 0)
    for s in sorted(sends, key=lambda s: s.began_s):
        in_force, which = None, 0
        for k, c in enumerate(ordered):
            nxt = ordered[k + 1] if k + 1 < len(ordered) else None
            if c.acked_s <= s.began_s and (nxt is None or s.ended_s < nxt.began_s):
                in_force, which = c, k + 1
        if in_force is None or s.outcome == "failed":
            verdict.unjudged += 1
            continue
        verdict.judged += 1
        if s.outcome == "ok" and not in_force.pub:
            verdict.violations.append(
                f"a send that began {s.began_s - in_force.acked_s:.3f} s after PUB was revoked "
                f"was accepted (change {which} of {len(ordered)})")
        elif s.outcome == "denied" and in_force.pub:
            verdict.violations.append(
                f"a send that began {s.began_s - in_force.acked_s:.3f} s after PUB was granted "
                f"was refused (change {which} of {len(ordered)})")
    return verdict
