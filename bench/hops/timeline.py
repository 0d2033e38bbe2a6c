"""A lone send's steps from the stamps of ``bench.hops.record`` (pure: no files, no clock).

Frames are told apart by their payload's third byte, which is the kind in both of our
envelopes (CBOR ``[version, kind, ...]``): 3 is Raft's append and 4 its answer
(``dledger.network.wire``); a client request's kind is 24 or more, which CBOR writes as the
byte 0x18 and the number after it (``protocol.broker_kinds``). A send is followed from the
client's request frame to the leader, to the first follower that decodes the append, through
that follower's inline sync (none in ``async`` flush mode), back to the leader and to the
client. The other follower's share arrives later and is not waited for.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

__all__ = ["ROUND_STEPS", "STEPS", "Stamp", "Timeline", "median_rounds", "median_steps"]

APPEND = 0x03
APPEND_ANSWER = 0x04
CLIENT_KIND = 0x18  # (the first byte of any kind from 24 up)
CLIENT = "client"

# (name, the stamp it ends at); each step starts where the one before it ended
STEPS = (
    ("client: send() called, to its request frame encoded", "client out"),
    ("to the leader: the request decoded", "leader in"),
    ("leader: the request decoded, to its append encoded", "leader out append"),
    ("to the first follower: the append decoded", "follower in append"),
    ("follower: the append decoded, to its sync started", "follower sync0"),
    ("follower: the sync", "follower sync1"),
    ("follower: to its answer encoded", "follower out answer"),
    ("to the leader: the answer decoded", "leader in answer"),
    ("leader: the answer decoded, to the reply encoded", "leader out reply"),
    ("to the client: the reply decoded", "client in"),
    ("client: the reply decoded, to send() returning", "returned"),
)


# a closed-loop round of many producers: from the request leaving to the next one leaving
ROUND_STEPS = (*STEPS[1:-1], ("client: the reply decoded, to its next request encoded (answers "
                              "settled, the producers sending again)", "next out"))


@dataclass(frozen=True)
class Stamp:
    ns: int
    process: str  # CLIENT or a node id
    event: str  # "out", "in", "sync0", "sync1"
    head: str  # the payload's first bytes in hex ("" for a sync)

    @property
    def kind(self) -> int:
        return int(self.head[4:6], 16) if len(self.head) >= 6 else -1


class Timeline:
    """Every process's stamps in time order."""

    def __init__(self, stamps: Sequence[Stamp]) -> None:
        self.stamps = sorted(stamps, key=lambda s: s.ns)
        self._ns = [s.ns for s in self.stamps]

    def first(self, after_ns: int, process: str | None, event: str, kind: int | None = None,
              not_process: str | None = None) -> Stamp | None:
        for s in self.stamps[bisect.bisect_left(self._ns, after_ns):]:
            if (process is None or s.process == process) and s.event == event \
                    and (kind is None or s.kind == kind) \
                    and (not_process is None or s.process not in (not_process, CLIENT)):
                return s
        return None

    def path(self, out: Stamp) -> list[int] | None:
        """The ns of the stamps a client's request frame ``out`` passes until the client
        decodes its reply: the ends of ``STEPS[:-1]``, or None if one is missing (a redirect,
        a retry)."""
        got = self.first(out.ns, None, "in", CLIENT_KIND, not_process=CLIENT)
        if got is None:
            return None
        leader = got.process
        append = self.first(got.ns, leader, "out", APPEND)
        taken = self.first(append.ns, None, "in", APPEND, not_process=leader) if append else None
        if append is None or taken is None:
            return None
        follower = taken.process
        answer = self.first(taken.ns, follower, "out", APPEND_ANSWER)
        if answer is None:
            return None
        sync0 = self.first(taken.ns, follower, "sync0")
        sync1 = self.first(sync0.ns, follower, "sync1") if sync0 else None
        if sync0 is None or sync1 is None or sync1.ns > answer.ns:
            sync0 = sync1 = taken  # (no sync on the way: async flush)
        heard = self.first(answer.ns, leader, "in", APPEND_ANSWER)
        reply = self.first(heard.ns, leader, "out", CLIENT_KIND) if heard else None
        back = self.first(reply.ns, CLIENT, "in") if reply else None
        if heard is None or reply is None or back is None:
            return None
        return [out.ns, got.ns, append.ns, taken.ns, sync0.ns, sync1.ns, answer.ns, heard.ns,
                reply.ns, back.ns]

    def send(self, start_ns: int, end_ns: int) -> list[int] | None:
        """The ns each of ``STEPS`` took for the send called at ``start_ns`` that returned at
        ``end_ns`` (a step with no sync, in ``async`` mode, is 0), or None if a stamp of its path
        is missing (a redirect, a retry, a send that went out with another)."""
        out = self.first(start_ns, CLIENT, "out")
        ends = self.path(out) if out is not None else None
        if ends is None or ends[-1] > end_ns:
            return None
        return _gaps([start_ns, *ends, end_ns])

    def rounds(self) -> list[list[int]]:
        """The ns each of ``ROUND_STEPS`` took, for every request of the client that was
        followed and answered before its next request left: closed-loop producers send again
        once their answers are in, so the client's requests go one at a time."""
        outs = [s for s in self.stamps if s.process == CLIENT and s.event == "out"]
        out = []
        for this, after in pairwise(outs):
            ends = self.path(this)
            if ends is not None and ends[-1] <= after.ns:
                out.append(_gaps([*ends, after.ns]))
        return out


def _gaps(ends: list[int]) -> list[int]:
    return [b - a for a, b in pairwise(ends)]


def median_steps(timeline: Timeline, sends: Sequence[tuple[int, int]]) -> tuple[list[float], int]:
    """The median us of each step over the sends followed, and how many were."""
    followed = [steps for t0, t1 in sends if (steps := timeline.send(t0, t1)) is not None]
    if not followed:
        return [], 0
    return [statistics.median(s[k] for s in followed) / 1e3 for k in range(len(STEPS))], len(followed)


def median_rounds(timeline: Timeline) -> tuple[list[float], int]:
    """The median us of each of ``ROUND_STEPS`` over the rounds followed, and how many were."""
    rounds = timeline.rounds()
    if not rounds:
        return [], 0
    return [statistics.median(r[k] for r in rounds) / 1e3 for k in range(len(ROUND_STEPS))], len(rounds)
