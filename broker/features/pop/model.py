"""Pop consumption, the pure part: which messages of a queue a consumer group holds invisible,
under which receipt, until when (RocketMQ 5's receive / ack / change-invisible-duration, the
consumption behind its SimpleConsumer and PushConsumer), replicated.

Per (consumer group, topic, queue) a ``PopQueue`` keeps a cursor (every offset below it was
handed out once, or skipped by the receiver's filter) and the offsets in flight: handed out,
not yet acknowledged, each with its receipt epoch, its delivery attempt, the time it becomes
visible again and whether it is ordered (it has a message group: FIFO). The group's consume
offset for the queue (what ``dledger consumer status`` shows, and where a new cursor starts
after a reset) is the lowest offset in flight, or the cursor.

Every change is a log entry (``broker.features.pop.entries``) applied on every replica:
- ``PopEntry``: the leader hands out offsets. Redeliveries name offsets in flight whose time
  has come (attempt + 1); fresh ones take ``[from, to)`` from the cursor (``from`` must be the
  cursor: a pop planned on a stale view is refused whole), handing out the offsets listed and
  skipping the rest. FIFO, the rule: an ordered offset is handed out only while no other
  ordered offset of the queue is in flight, so the messages of a message group are delivered
  one at a time, in queue order, the next only once the previous is acknowledged (or dead).
- ``PopAck``: offsets acknowledged, each under the epoch its receipt names; a receipt whose
  epoch is no longer the offset's (it was redelivered since, or its invisibility changed) is
  refused, and an offset no longer in flight below the cursor is acknowledged already (the
  answer to a retried ack is the same).
- ``PopChange``: a new invisible time for an offset in flight under its current epoch; the
  entry's index becomes its epoch (the old receipt stops working, as in RocketMQ).
- ``PopDead``: an offset in flight moved to the group's dead-letter queue (its delivery
  attempts used up, or the consumer gave up on it), the copy stored by the same entry.

A receipt's epoch is the index of the entry that handed out (or last changed) its offset:
unique, so a receipt can never name a later delivery. Time is the entries' store time made
monotonic (``clock_ms``), as the queue locks' (``broker.features.orderly.model``). In-flight offsets of one
queue are bounded by ``INFLIGHT_MAX``: a pop hands out no more until some are acknowledged.

Why an acknowledged message is never delivered again, across any leader change: an ack is
answered only after its entry is applied, which removed the offset from flight for good, on
every replica; offsets below the cursor are never handed out fresh, and redeliveries take only
offsets in flight. Why a message is never lost: an offset leaves flight only by an ack or by a
dead-letter entry that stores its copy in the same apply.

Pure and deterministic: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

INFLIGHT_MAX = 2048  # offsets of one queue a group may hold invisible at once
INVISIBLE_MS_MIN = 1_000
INVISIBLE_MS_MAX = 12 * 3_600_000  # RocketMQ proxy's 12 h
POP_CANARIES = frozenset({"pop_ack_lost"})

PopKey = tuple[str, str, int]  # (consumer group, topic, queue id)


class PopConflict(Exception):
    """A pop entry that no longer fits the queue's state (planned on a stale view)."""


@dataclass(slots=True)
class InFlight:
    epoch: int  # the index of the entry that handed it out or last changed it
    attempt: int  # its delivery attempt, 1 for the first
    visible_ms: int  # when it may be handed out again
    ordered: bool  # it has a message group (FIFO)


class PopQueue:
    __slots__ = ("cursor", "inflight")

    def __init__(self, cursor: int) -> None:
        self.cursor = cursor
        self.inflight: dict[int, InFlight] = {}

    def committed(self) -> int:
        return min(self.inflight) if self.inflight else self.cursor

    def ordered_in_flight(self) -> bool:
        return any(f.ordered for f in self.inflight.values())


class PopTable:
    __slots__ = ("queues", "clock_ms", "canaries")

    def __init__(self, canaries: frozenset[str] = frozenset()) -> None:
        self.queues: dict[PopKey, PopQueue] = {}
        self.clock_ms = 0
        self.canaries = canaries

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PopTable) and self.snapshot() == other.snapshot()

    def tick(self, ts_ms: int) -> int:
        self.clock_ms = max(self.clock_ms, ts_ms)
        return self.clock_ms

    def get(self, key: PopKey) -> PopQueue | None:
        return self.queues.get(key)

    # -- changes (one per entry kind) -------------------------------------------------------------

    def pop(self, key: PopKey, index: int, ts_ms: int, invisible_ms: int, start: int,
            first: int, length: int, redeliver: Iterable[int], lo: int, hi: int,
            fresh: Iterable[tuple[int, bool]]) -> list[tuple[int, int]]:
        """Hand out ``redeliver`` (offsets in flight whose time has come) and ``fresh`` (offsets
        in ``[lo, hi)``, each with whether it is ordered; the others of the range are skipped),
        moving the cursor to ``hi``. ``start`` is where a queue the group never popped starts
        (its committed offset, or the queue's first); ``first`` and ``length`` are the queue's
        first retained offset and its length. All or nothing: ``PopConflict`` if any of it does
        not fit. Returns (offset, attempt) of each handed out, redeliveries first."""
        now = self.tick(ts_ms)
        q = self.queues.get(key)
        cursor = q.cursor if q is not None else start
        redeliver, fresh = list(redeliver), list(fresh)
        inflight = q.inflight if q is not None else {}
        for off in redeliver:
            f = inflight.get(off)
            if f is None or f.visible_ms > now:
                raise PopConflict(f"offset {off} is not due for redelivery")
        if hi > lo:
            if lo != cursor and not (cursor < first and lo == first):
                # (a cursor behind the queue's first retained offset moves up to it)
                raise PopConflict(f"a pop from {lo} while the cursor is at {cursor}")
            if hi > length:
                raise PopConflict(f"a pop to {hi} past the queue's end {length}")
            if any(not lo <= off < hi for off, _ in fresh) or \
                    len({off for off, _ in fresh}) != len(fresh):
                raise PopConflict("fresh offsets outside the range popped, or repeated")
        elif fresh:
            raise PopConflict("fresh offsets with an empty range")
        ordered_busy = any(f.ordered for o, f in inflight.items() if o not in redeliver)
        ordered = [off for off, o in fresh if o] + [o for o in redeliver if inflight[o].ordered]
        if len(ordered) > 1 or (ordered and ordered_busy):
            raise PopConflict("an ordered message while another of the queue is in flight")
        if len(inflight) + len(fresh) > INFLIGHT_MAX:
            raise PopConflict(f"more than {INFLIGHT_MAX} messages of the queue in flight")
        if q is None:
            q = self.queues[key] = PopQueue(cursor)
        out = []
        for off in redeliver:
            f = q.inflight[off]
            f.epoch, f.attempt, f.visible_ms = index, f.attempt + 1, now + invisible_ms
            out.append((off, f.attempt))
        for off, is_ordered in fresh:
            q.inflight[off] = InFlight(index, 1, now + invisible_ms, is_ordered)
            out.append((off, 1))
        if hi > lo:
            q.cursor = hi
        return out

    def ack(self, key: PopKey, ts_ms: int, entries: Iterable[tuple[int, int]]) -> list[bool]:
        """Acknowledge each (offset, epoch): True if it was in flight under that epoch, or had
        left flight below the cursor (acknowledged already); False for a stale receipt."""
        self.tick(ts_ms)
        q = self.queues.get(key)
        out = []
        for off, epoch in entries:
            f = q.inflight.get(off) if q is not None else None
            if f is not None and f.epoch == epoch:
                if "pop_ack_lost" not in self.canaries:  # the canary answers but forgets it
                    del q.inflight[off]  # type: ignore[union-attr]
                out.append(True)
            else:
                out.append(f is None and q is not None and off < q.cursor)
        return out

    def change(self, key: PopKey, index: int, ts_ms: int, offset: int, epoch: int,
               invisible_ms: int) -> bool:
        """A new invisible time for ``offset`` under its current ``epoch``; its epoch becomes
        ``index``. False: not in flight under that epoch."""
        now = self.tick(ts_ms)
        q = self.queues.get(key)
        f = q.inflight.get(offset) if q is not None else None
        if f is None or f.epoch != epoch:
            return False
        f.epoch, f.visible_ms = index, now + invisible_ms
        return True

    def dead(self, key: PopKey, ts_ms: int, offset: int, epoch: int) -> bool:
        """``offset`` leaves flight for the dead-letter queue (its entry stores the copy).
        False: not in flight under that epoch (nothing stored)."""
        self.tick(ts_ms)
        q = self.queues.get(key)
        f = q.inflight.get(offset) if q is not None else None
        if f is None or f.epoch != epoch:
            return False
        del q.inflight[offset]  # type: ignore[union-attr]
        return True

    def reset(self, key: PopKey, offset: int) -> None:
        """The group's offset set by an admin or a commit: the pop state starts there again
        (what was in flight is forgotten)."""
        if key in self.queues:
            self.queues[key] = PopQueue(offset)

    def forget_topic(self, topic: str) -> None:
        for key in [k for k in self.queues if k[1] == topic]:
            del self.queues[key]

    # -- reads for the leader's planning ----------------------------------------------------------

    def due(self, key: PopKey, now_ms: int) -> list[tuple[int, InFlight]]:
        """Offsets in flight whose invisible time is over at ``now_ms``, lowest first."""
        q = self.queues.get(key)
        if q is None:
            return []
        return sorted((o, f) for o, f in q.inflight.items() if f.visible_ms <= now_ms)

    def next_visible_ms(self, key: PopKey) -> int | None:
        q = self.queues.get(key)
        return min((f.visible_ms for f in q.inflight.values()), default=None) if q else None

    # -- checkpoint -------------------------------------------------------------------------------

    def snapshot(self) -> list[Any]:
        return [self.clock_ms, sorted(
            [g, t, qid, q.cursor, sorted([o, f.epoch, f.attempt, f.visible_ms, f.ordered]
                                         for o, f in q.inflight.items())]
            for (g, t, qid), q in self.queues.items())]

    @classmethod
    def restore(cls, blob: Any, canaries: frozenset[str] = frozenset()) -> PopTable:
        table = cls(canaries)
        clock, rows = blob
        if not isinstance(clock, int) or not isinstance(rows, list):
            raise ValueError("malformed pop table")
        table.clock_ms = clock
        for g, t, qid, cursor, flights in rows:
            if not (isinstance(g, str) and isinstance(t, str) and isinstance(qid, int)
                    and isinstance(cursor, int) and isinstance(flights, list)):
                raise ValueError("malformed pop queue")
            q = table.queues[(g, t, qid)] = PopQueue(cursor)
            for o, epoch, attempt, visible, ordered in flights:
                if not all(isinstance(v, int) for v in (o, epoch, attempt, visible)) \
                        or not isinstance(ordered, bool):
                    raise ValueError("malformed message in flight")
                q.inflight[o] = InFlight(epoch, attempt, visible, ordered)
        return table


__all__ = [
    "INFLIGHT_MAX",
    "INVISIBLE_MS_MAX",
    "INVISIBLE_MS_MIN",
    "POP_CANARIES",
    "InFlight",
    "PopConflict",
    "PopKey",
    "PopQueue",
    "PopTable",
]
