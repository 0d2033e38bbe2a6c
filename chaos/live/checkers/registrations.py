"""The checker of the NameServer's registration guard (``namesrv.registration_auth``) and its
leader corroboration (``namesrv.registry``) over what the forger recorded during a live run
(``chaos.live.forger``): each forged request sent to the NameServer and its answer, the routes
read after it, and the negative controls (the same kind of request, signed with the cluster's
credential, which must pass).

Judged:
- a forgery (unsigned, signed with a wrong credential, a replay, a spoofed unregister) answered
  2xx: "registrations: accepted";
- a forged node id routed as a group's leader at any read: "registrations: routed";
- a signed control answered other than 2xx while the NameServer answered at all:
  "registrations: control refused" (the check refusing everything would pass the rest).
A request that got no answer (the NameServer killed or cut off) is counted, not judged.

Pure: the records are data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LINES_MAX = 10
FORGED_PREFIX = "forged-"  # the node ids the forger claims for (never a real member)


@dataclass(frozen=True, slots=True)
class Attempt:
    kind: str  # "unsigned_claim", "wrong_key_claim", "far_claim", "replay", "spoofed_unregister",
    #           or "control" (signed right: must pass)
    status: int | None  # the HTTP status; None: no answer


@dataclass
class RegistrationsVerdict:
    forged: int = 0  # forgeries answered
    refused: int = 0  # of them, refused (401 / 403)
    controls: int = 0  # signed controls answered 2xx
    unanswered: int = 0
    routed_reads: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def lines(self) -> list[str]:
        out = [f"registrations: {v}" for v in self.violations[:LINES_MAX]]
        if len(self.violations) > LINES_MAX:
            out.append(f"registrations: ... and {len(self.violations) - LINES_MAX} more")
        return out

    def summary(self) -> dict[str, int]:
        return {"forged": self.forged, "refused": self.refused, "controls": self.controls,
                "unanswered": self.unanswered, "routed_reads": self.routed_reads}


def check_registrations(attempts: list[Attempt],
                        routed_leaders: list[str | None]) -> RegistrationsVerdict:
    """``attempts`` in the order sent; ``routed_leaders``: the leader each route read showed."""
    v = RegistrationsVerdict()
    for a in attempts:
        if a.status is None:
            v.unanswered += 1
        elif a.kind == "control":
            if 200 <= a.status < 300:
                v.controls += 1
            else:
                v.violations.append(f"control refused: a signed registration got {a.status}")
        else:
            v.forged += 1
            if 200 <= a.status < 300:
                v.violations.append(f"accepted: a {a.kind} got {a.status}")
            elif a.status in (401, 403):
                v.refused += 1
    for leader in routed_leaders:
        v.routed_reads += 1
        if leader is not None and leader.startswith(FORGED_PREFIX):
            v.violations.append(f"routed: the forged node {leader} was routed as the leader")
    return v
