"""Pop consumption, the pure part: which messages of a queue a consumer group holds invisible,
under which receipt, until when (RocketMQ 5's receive / ack / change-invisible-duration, the
consumption behind its SimpleConsumer and PushConsumer), replicated.

Per (consumer group, topic, queue) a ``PopQueue`` keeps a cursor (every offset below it was
handed out once, held back, or skipped by the receiver's filter), the offsets in flight (handed
out, not yet acknowledged, each with its receipt epoch, its delivery attempt, the time it
becomes visible again and its message group if it is ordered: FIFO) and the offsets held back
(ordered ones the cursor passed while an earlier message of their group was in flight or held
back). The group's consume offset for the queue (what ``dledger consumer status`` shows, and
where a new cursor starts after a reset) is the lowest offset in flight or held back, or the
cursor.

Priority (``protocol.priority``): a pop may hand out an offset past lower priorities, parking
those (below the cursor, counted in the group's offset) for a later pop. The leader plans which
(``broker.features.pop.scan``); the model checks that a parked offset goes out once, none lost.

Every change is a log entry (``broker.features.pop.entries``) applied on every replica:
- ``PopEntry``: the leader hands out offsets. Redeliveries name offsets in flight whose time
  has come (attempt + 1); releases name offsets held back whose group is free now; fresh ones
  take ``[from, to)`` from the cursor (``from`` must be the cursor: a pop planned on a stale
  view is refused whole), handing out the offsets listed, holding back those listed as held and
  skipping the rest; ``parked`` and ``unpark`` park offsets of the range and hand out parked
  ones (priority). FIFO, the rule (RocketMQ 5's, per message group): an ordered offset is
  handed out only while no other offset of its message group is in flight or held back below
  it, so the messages of a group are delivered one at a time, in queue order, the next only
  once the previous is acknowledged (or dead); different groups of one queue proceed in
  parallel. An offset held back waits behind an earlier message of its group (or, planned
  while one was in flight, until a later pop), and is released lowest first. Entries written
  before per-group FIFO name no group: their ordered offsets hold back every ordered message
  of the queue (``WHOLE_QUEUE``), the rule they were planned under.
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
monotonic (``clock_ms``), as the queue locks' (``broker.features.orderly.model``). The offsets of
one queue in flight, held back and parked are bounded by ``INFLIGHT_MAX``: a pop hands out no more until
some are acknowledged.

Why an acknowledged message is never delivered again, across any leader change: an ack is
answered only after its entry is applied, which removed the offset from flight for good, on
every replica; offsets below the cursor are never handed out fresh, and redeliveries take only
offsets in flight (and releases only offsets held back, which were never handed out). Why a
message is never lost: an offset leaves flight only by an ack or by a dead-letter entry that
stores its copy in the same apply, and leaves the held-back set only into flight.

Seeded bugs (tests only): ``pop_ack_lost`` answers an ack but keeps the offset in flight;
``fifo_group_overlap`` forgets, when deciding whether a group is free, the messages of the
group in flight, so a group's next message is handed out while the previous one is in flight
(the FIFO checker, ``chaos.live.checkers.pop``, must catch both). ``ttl_ignored`` (the leader's
receive, ``broker.features.pop.service``) skips the TTL check: expired messages are handed out
(the TTL checker, ``chaos.live.checkers.timed``, must catch it); ``priority_park_lost`` makes
a new leader forget the parked set (it hands out only what it parked itself): the messages
parked before a leader change are never handed out (the pop checker's loss).

Pure and deterministic: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

INFLIGHT_MAX = 2048  # offsets of one queue a group may hold invisible at once
INVISIBLE_MS_MIN = 1_000
INVISIBLE_MS_MAX = 12 * 3_600_000  # RocketMQ proxy's 12 h
POP_CANARIES = frozenset({"pop_ack_lost", "fifo_group_overlap"})
POP_LEADER_CANARIES = frozenset({"ttl_ignored", "priority_park_lost"})  # the leader's receive's
# The group of an ordered offset whose entry named none (written before per-group FIFO): it
# holds back every ordered message of its queue, and is held back by any.
WHOLE_QUEUE = "\x00whole queue"

PopKey = tuple[str, str, int]  # (consumer group, topic, queue id)


class PopConflict(Exception):
    """A pop entry that no longer fits the queue's state (planned on a stale view)."""


@dataclass(slots=True)
class InFlight:
    epoch: int  # the index of the entry that handed it out or last changed it
    attempt: int  # its delivery attempt, 1 for the first
    visible_ms: int  # when it may be handed out again
    group: str | None  # its message group if it is ordered (FIFO)


def blocked(busy: set[str], group: str) -> bool:
    """FIFO's rule: whether an ordered message of ``group`` must wait, the groups in ``busy``
    having a message in flight or held back (``WHOLE_QUEUE`` stands for every group)."""
    return group in busy or WHOLE_QUEUE in busy or (group == WHOLE_QUEUE and bool(busy))


class PopQueue:
    __slots__ = ("cursor", "inflight", "held", "parked")

    def __init__(self, cursor: int) -> None:
        self.cursor = cursor
        self.inflight: dict[int, InFlight] = {}
        self.held: dict[int, str] = {}  # offset -> its message group: waiting behind an earlier one
        self.parked: dict[int, int] = {}  # offset -> its priority: passed for a higher one

    def committed(self) -> int:
        return min(min(self.inflight, default=self.cursor), min(self.held, default=self.cursor),
                   min(self.parked, default=self.cursor), self.cursor)

    def holding(self) -> int:
        """Offsets in flight, held back or parked: bounded by ``INFLIGHT_MAX``."""
        return len(self.inflight) + len(self.held) + len(self.parked)

    def groups_in_flight(self) -> set[str]:
        return {f.group for f in self.inflight.values() if f.group is not None}


class GroupGate:
    """Which ordered messages of a queue may be handed out, as a pop plans or checks them in
    offset order: the groups busy (in flight, held back, or taken by this pop so far)."""

    __slots__ = ("busy",)

    def __init__(self, busy: set[str]) -> None:
        self.busy = busy

    def free(self, group: str) -> bool:
        return not blocked(self.busy, group)

    def take(self, group: str) -> None:
        self.busy.add(group)


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
            fresh: Iterable[tuple[int, str | None]], release: Iterable[int] = (),
            held: Iterable[tuple[int, str]] = (), parked: Iterable[tuple[int, int]] = (),
            unpark: Iterable[int] = ()) -> list[tuple[int, int]]:
        """Hand out ``redeliver`` (offsets in flight whose time has come), ``release`` (offsets
        held back whose group is free) and ``fresh`` (offsets in ``[lo, hi)``, each with its
        message group or None), hold back ``held`` (offsets in ``[lo, hi)`` with their group),
        park ``parked`` (offsets in ``[lo, hi)`` with their priority, passed over for a higher
        one), hand out ``unpark`` (offsets parked before), skip the others of the range, and
        move the cursor to ``hi``. ``start`` is where a
        queue the group never popped starts (its committed offset, or the queue's first);
        ``first`` and ``length`` are the queue's first retained offset and its length. All or
        nothing: ``PopConflict`` if any of it does not fit. Returns (offset, attempt) of each
        handed out: redeliveries, releases, offsets parked before, then fresh ones."""
        now = self.tick(ts_ms)
        q = self.queues.get(key)
        cursor = q.cursor if q is not None else start
        redeliver, fresh, release, held = list(redeliver), list(fresh), list(release), list(held)
        parked, unpark = list(parked), list(unpark)
        inflight = q.inflight if q is not None else {}
        waiting = q.held if q is not None else {}
        passed = q.parked if q is not None else {}
        if any(off not in passed for off in unpark) or len(set(unpark)) != len(unpark):
            raise PopConflict("an offset handed out from the parked ones is not parked")
        for off in redeliver:
            f = inflight.get(off)
            if f is None or f.visible_ms > now:
                raise PopConflict(f"offset {off} is not due for redelivery")
        taken = [off for off, _ in fresh] + [off for off, _ in held] + [off for off, _ in parked]
        if hi > lo:
            if lo != cursor and not (cursor < first and lo == first):
                # (a cursor behind the queue's first retained offset moves up to it)
                raise PopConflict(f"a pop from {lo} while the cursor is at {cursor}")
            if hi > length:
                raise PopConflict(f"a pop to {hi} past the queue's end {length}")
            if any(not lo <= off < hi for off in taken) or len(set(taken)) != len(taken):
                raise PopConflict("fresh or held offsets outside the range popped, or repeated")
        elif taken:
            raise PopConflict("fresh or held offsets with an empty range")
        self._check_fifo(q, release, fresh, held)
        if len(inflight) + len(waiting) + len(passed) + len(taken) > INFLIGHT_MAX:
            raise PopConflict(f"more than {INFLIGHT_MAX} messages of the queue in flight or "
                              f"held back")
        if q is None:
            q = self.queues[key] = PopQueue(cursor)
        out = []
        for off in redeliver:
            f = q.inflight[off]
            f.epoch, f.attempt, f.visible_ms = index, f.attempt + 1, now + invisible_ms
            out.append((off, f.attempt))
        for off in release:
            q.inflight[off] = InFlight(index, 1, now + invisible_ms, q.held.pop(off))
            out.append((off, 1))
        for off in unpark:
            del q.parked[off]
            q.inflight[off] = InFlight(index, 1, now + invisible_ms, None)
            out.append((off, 1))
        for off, group in fresh:
            q.inflight[off] = InFlight(index, 1, now + invisible_ms, group)
            out.append((off, 1))
        q.held.update(held)
        q.parked.update(parked)
        if hi > lo:
            q.cursor = hi
        return out

    def _check_fifo(self, q: PopQueue | None, release: list[int],
                    fresh: list[tuple[int, str | None]], held: list[tuple[int, str]]) -> None:
        """FIFO's rule over one pop (``PopConflict`` if broken): each offset released is the
        lowest held back of its group, and its group has nothing in flight; in offset order,
        each ordered offset handed out finds its group free (none of it in flight or held back
        below it). One held back needs no check: it waits (its group may have come free since
        the leader planned, by an ack applied first; a later pop releases it)."""
        waiting = q.held if q is not None else {}
        gate = GroupGate(self._flying(q))
        for off in sorted(release):
            group = waiting.get(off)
            if group is None:
                raise PopConflict(f"offset {off} is not held back")
            if not gate.free(group) or any(o < off and g == group for o, g in waiting.items()):
                raise PopConflict(f"offset {off} released while its group is busy")
            gate.take(group)
        for o, g in waiting.items():
            if o not in release:
                gate.take(g)
        for off, group, hold in sorted([(o, g, False) for o, g in fresh if g is not None]
                                       + [(o, g, True) for o, g in held]):
            if not hold and not gate.free(group):
                raise PopConflict(f"offset {off} handed out while its group is busy")
            gate.take(group)

    def _flying(self, q: PopQueue | None) -> set[str]:
        """The groups with a message in flight (the canary forgets them)."""
        if q is None or "fifo_group_overlap" in self.canaries:
            return set()
        return q.groups_in_flight()

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
                out.append(f is None and q is not None and off < q.cursor and off not in q.held
                           and off not in q.parked)
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

    def gate(self, key: PopKey) -> GroupGate:
        """The groups of the queue busy (in flight or held back; those released by the pop
        being planned stay busy, in flight): what a fresh ordered offset must wait behind."""
        q = self.queues.get(key)
        busy = self._flying(q)
        if q is not None:
            busy.update(q.held.values())
        return GroupGate(busy)

    def releasable(self, key: PopKey) -> list[int]:
        """The offsets held back that may be handed out now: the lowest of each group with
        nothing in flight, lowest first."""
        q = self.queues.get(key)
        if q is None or not q.held:
            return []
        gate = GroupGate(self._flying(q))
        out = []
        for off, group in sorted(q.held.items()):
            if gate.free(group):
                out.append(off)
            gate.take(group)
        return out

    def parked(self, key: PopKey) -> dict[int, int]:
        """The offsets of the queue parked (passed for a higher priority), with their priority."""
        q = self.queues.get(key)
        return dict(q.parked) if q is not None else {}

    def next_visible_ms(self, key: PopKey) -> int | None:
        q = self.queues.get(key)
        return min((f.visible_ms for f in q.inflight.values()), default=None) if q else None

    # -- checkpoint -------------------------------------------------------------------------------

    def snapshot(self) -> list[Any]:  # (parked offsets last, only if any: the older form)
        return [self.clock_ms, sorted(
            [g, t, qid, q.cursor,
             sorted([o, f.epoch, f.attempt, f.visible_ms, f.group if f.group is not None else False]
                    for o, f in q.inflight.items()),
             sorted([o, group] for o, group in q.held.items()),
             *([sorted([o, p] for o, p in q.parked.items())] if q.parked else [])]
            for (g, t, qid), q in self.queues.items())]

    @classmethod
    def restore(cls, blob: Any, canaries: frozenset[str] = frozenset()) -> PopTable:
        """The table from ``snapshot()``'s form; also the form before per-group FIFO (no held
        offsets; in flight, whether ordered: true reads as ``WHOLE_QUEUE``)."""
        table = cls(canaries)
        clock, rows = blob
        if not isinstance(clock, int) or not isinstance(rows, list):
            raise ValueError("malformed pop table")
        table.clock_ms = clock
        for g, t, qid, cursor, flights, *rest in rows:
            held = rest[0] if 1 <= len(rest) <= 2 else [] if not rest else None
            parked = rest[1] if len(rest) == 2 else []
            if not (isinstance(g, str) and isinstance(t, str) and isinstance(qid, int)
                    and isinstance(cursor, int) and isinstance(flights, list)
                    and isinstance(held, list) and isinstance(parked, list)):
                raise ValueError("malformed pop queue")
            q = table.queues[(g, t, qid)] = PopQueue(cursor)
            for o, epoch, attempt, visible, group in flights:
                if not all(isinstance(v, int) for v in (o, epoch, attempt, visible)):
                    raise ValueError("malformed message in flight")
                q.inflight[o] = InFlight(epoch, attempt, visible, group_of(group))
            for o, group in held:
                if not isinstance(o, int) or not isinstance(group, str):
                    raise ValueError("malformed message held back")
                q.held[o] = group
            for o, priority in parked:
                if not isinstance(o, int) or not isinstance(priority, int):
                    raise ValueError("malformed message parked")
                q.parked[o] = priority
        return table


def group_of(v: Any) -> str | None:
    """An offset's message group from its stored form: a string, false (not ordered) or, as
    written before per-group FIFO, true (ordered, its group unnamed: ``WHOLE_QUEUE``)."""
    if isinstance(v, bool):
        return WHOLE_QUEUE if v else None
    if isinstance(v, str):
        return v
    raise ValueError(f"a message group is a string or a bool, not {type(v).__name__}")


__all__ = [
    "INFLIGHT_MAX",
    "INVISIBLE_MS_MAX",
    "INVISIBLE_MS_MIN",
    "POP_CANARIES",
    "POP_LEADER_CANARIES",
    "WHOLE_QUEUE",
    "GroupGate",
    "InFlight",
    "PopConflict",
    "PopKey",
    "PopQueue",
    "PopTable",
    "blocked",
    "group_of",
]
