"""The checkers of recalled delayed messages and of message TTLs, over what a RocketMQ 5 client
recorded in a live chaos run (``chaos.live.grpc_timed``): the delayed sends acknowledged (each
one's due time), the outcome of each recall (acknowledged, refused, or unknown), the sends with
a TTL, and every delivery with the wall-clock times of its receive call and the store time the
broker gave.

Judged, for recall (RecallMessage, ``broker.features.delay.apply``):
- *delivered*: a message whose recall was acknowledged received at all;
- *lost*: an acknowledged delayed message no recall was tried for never received;
- *early*: a delayed message received by a call that returned before its due time (it was
  handed out before it was due).
A refused recall (NOT_FOUND, "delivered, or recalled already") and one without an answer say
nothing for certain (the endpoint may have tried the recall again after a first try it did not
hear back from was applied): their messages are judged only for *early*.

Judged, for TTL (``protocol.message_ttl``: expired once store time plus TTL is before now):
- *expired*: a message received by a call that began after its store time plus its TTL (the
  broker decides at hand-out, which is after the call began);
- *lost*: an acknowledged message whose TTL had not passed when the consumers caught up
  never received (the run gives these a TTL far beyond its length).
Messages of a short TTL not received are counted as expired, not judged: the slow consumer
lets them expire on purpose.

Every node runs on the client's machine, on one clock; ``CLOCK_SLACK_MS`` only covers the
rounding of times to milliseconds. Pure: the run records the history; this only judges.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

LINES_MAX = 10
CLOCK_SLACK_MS = 10  # one machine, one clock: the ms rounding of the broker's times only


@dataclass(frozen=True, slots=True)
class Seen:
    """One delivery: a received message and the receive call that returned it."""

    message_id: str
    began_ms: float  # wall clock, when the receive call began
    ended_ms: float  # wall clock, when it returned
    store_ms: int | None = None  # the store time the broker gave (None: not given)
    ttl_ms: int | None = None  # its TTL_MS property (None: none)
    due_ms: int | None = None  # its delivery timestamp (None: not a delayed message)


@dataclass
class RecallVerdict:
    delayed: int  # acknowledged delayed sends
    recalled: int  # their recalls acknowledged
    received: int  # delayed messages received (each counted once)
    delivered: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    early: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.delivered or self.lost or self.early)

    def lines(self) -> list[str]:
        out = [f"recall: delivered: {line}" for line in self.delivered[:LINES_MAX]]
        out += [f"recall: lost: acknowledged delayed send {m} (no recall tried) never received"
                for m in self.lost[:LINES_MAX]]
        out += [f"recall: early: {line}" for line in self.early[:LINES_MAX]]
        return out


def check_recall(due_ms: dict[str, int], recalls: dict[str, str], seen: Iterable[Seen]
                 ) -> RecallVerdict:
    """``due_ms``: each acknowledged delayed send's due time; ``recalls``: message id -> the
    outcome of its recall ("ok", "refused" or "unknown"); ``seen``: the delayed topic's
    deliveries."""
    first: dict[str, Seen] = {}
    v = RecallVerdict(len(due_ms), sum(1 for o in recalls.values() if o == "ok"), 0)
    for s in sorted(seen, key=lambda s: s.ended_ms):
        due = due_ms.get(s.message_id, s.due_ms)
        if due is not None and s.ended_ms + CLOCK_SLACK_MS < due:
            v.early.append(f"{s.message_id} received {due - s.ended_ms:.0f} ms before its due "
                           f"time {due}")
        if recalls.get(s.message_id) == "ok" and s.message_id not in first:
            v.delivered.append(f"{s.message_id} received (its receive returned at "
                               f"{s.ended_ms:.0f}, due {due}) although its recall was "
                               f"acknowledged")
        first.setdefault(s.message_id, s)
    v.received = sum(1 for m in first if m in due_ms)
    v.lost = sorted(m for m in due_ms if m not in recalls and m not in first)
    return v


@dataclass
class TtlVerdict:
    received: int  # messages with a TTL received (each counted once)
    kept: int  # acknowledged sends that must not expire within the run
    expired: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.expired or self.lost)

    def lines(self) -> list[str]:
        out = [f"ttl: expired: {line}" for line in self.expired[:LINES_MAX]]
        out += [f"ttl: lost: acknowledged send {m} (its TTL not passed) never received"
                for m in self.lost[:LINES_MAX]]
        return out


def check_ttl(kept: set[str], seen: Iterable[Seen]) -> TtlVerdict:
    """``kept``: the acknowledged sends whose TTL outlasts the run; ``seen``: the TTL topic's
    deliveries (their TTL and store time as the broker gave them)."""
    got: set[str] = set()
    expired: list[str] = []
    for s in sorted(seen, key=lambda s: s.began_ms):
        got.add(s.message_id)
        if s.ttl_ms is None or s.store_ms is None:
            continue
        late_ms = s.began_ms - (s.store_ms + s.ttl_ms)
        if late_ms > CLOCK_SLACK_MS:
            expired.append(f"{s.message_id} (TTL {s.ttl_ms} ms, stored at {s.store_ms}) "
                           f"received by a receive that began {late_ms:.0f} ms after it expired")
    return TtlVerdict(len(got), len(kept), expired, sorted(kept - got))


__all__ = ["CLOCK_SLACK_MS", "RecallVerdict", "Seen", "TtlVerdict", "check_recall",
           "check_ttl"]
