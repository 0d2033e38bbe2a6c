"""Delayed and timed messages, the pure part: the delay levels, the leader's rewrite of a delayed
send into the schedule topic, and the index of pending timers that the state machine keeps.

A message is delayed by one of its properties (RocketMQ's names): ``DELAY`` (a level, 1..18 by
default: ``1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h``), or, as RocketMQ 5's
timer messages, ``TIMER_DELIVER_MS`` (an absolute time, ms since the epoch), ``TIMER_DELAY_MS`` or
``TIMER_DELAY_SEC`` (relative), at most ``max_delay_ms`` ahead (7 days by default).

The leader turns each into a due time from its own clock (``schedule_message``), so replicas
never consult a clock or a level table: the message is stored in ``SCHEDULE_TOPIC_XXXX`` queue 0
with ``REAL_TOPIC``, ``REAL_QID`` and ``TIMER_DELIVER_MS`` set (RocketMQ's put-time rewrite), and
the state machine adds a timer ``(due ms, schedule queue offset)`` to a ``DelayIndex``. The
leader's delay service (``broker.features.delay.service``) later proposes a deliver entry carrying a copy
of each due message for its real queue; applying it takes each timer out of the index, so a
timer is delivered once however many leaders propose it (RocketMQ re-puts a copy the same way).

The index holds 16 bytes per pending timer, packed, in buckets of ``BUCKET_MS`` by due time: no
Python object per message however far ahead it is due. A bucket the state machine has begun to
take timers from is held as a dict (about 100 bytes a timer) until it empties; only due buckets
are ever opened. Pure and deterministic: equal operation sequences give equal snapshots.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable
from typing import Any

from protocol.int_property import natural
from protocol.topics import SCHEDULE_TOPIC  # RocketMQ's; one queue (0) holds every pending message

SCHEDULE_QUEUE = 0
DELAY = "DELAY"
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
TIMER_PROPERTIES = (DELAY, TIMER_DELIVER_MS, TIMER_DELAY_MS, TIMER_DELAY_SEC)

DEFAULT_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
DEFAULT_MAX_DELAY_MS = 7 * 24 * 3600 * 1000
BUCKET_MS = 10_000
# Seeded bugs (tests only): "delay_early" delivers timers EARLY_MS before they are due (the
# service); "timer_redeliver" stores a delivered timer's message again when a delivery names it
# twice (the apply) and makes a new leader deliver every due message again (the service);
# "recall_ignored" answers a recall OK and leaves the timer pending (the apply).
DELAY_CANARIES = frozenset({"delay_early", "timer_redeliver", "recall_ignored"})
RECORD = struct.Struct("<QQ")  # due time (ms), offset in the schedule queue
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class DelayError(ValueError):
    """A delay that cannot be honoured: a malformed level or time, or one too far ahead."""


def parse_levels(text: str) -> tuple[int, ...]:
    """``"1s 5s 1m 2h"`` -> delays in ms (RocketMQ's ``messageDelayLevel``; units ms s m h d)."""
    out = []
    for word in text.split():
        unit = next((u for u in ("ms", "s", "m", "h", "d") if word.endswith(u)), None)
        number = word[: -len(unit)] if unit else ""
        if unit is None or not number.isdigit() or int(number) <= 0:
            raise DelayError(f"a delay level is a positive number with a unit (ms s m h d), "
                             f"not {word!r}")
        out.append(int(number) * _UNITS_MS[unit])
    if not out:
        raise DelayError("at least one delay level is needed")
    return tuple(out)


def due_of(props: Iterable[list[str] | tuple[str, str]], now_ms: int, levels: tuple[int, ...],
           max_delay_ms: int) -> int | None:
    """The due time of a message with these properties, or None if it is not delayed (no timer
    property, or level 0). A level above the last is the last (RocketMQ's rule); a time in the
    past is due now."""
    found = [(name, value) for name, value in props if name in TIMER_PROPERTIES]
    if not found:
        return None
    if len(found) > 1:
        raise DelayError(f"a message takes one of {', '.join(TIMER_PROPERTIES)}, not "
                         f"{', '.join(n for n, _ in found)}")
    name, value = found[0]
    number = natural(value, 18)
    if number is None:
        raise DelayError(f"{name} must be a non-negative integer, not {value[:40]!r}")
    if name == DELAY:
        if number == 0:
            return None
        return now_ms + levels[min(number, len(levels)) - 1]
    due = number if name == TIMER_DELIVER_MS else now_ms + number * (
        1000 if name == TIMER_DELAY_SEC else 1)
    if due - now_ms > max_delay_ms:
        raise DelayError(f"{name} {value} is more than {max_delay_ms} ms ahead (the broker's "
                         f"maximum delay)")
    return max(due, now_ms)


def route_run(topic: str, queue_id: int, messages: list[list[Any]], now_ms: int,
              levels: tuple[int, ...], max_delay_ms: int, batch: bool
              ) -> tuple[str, int, list[list[Any]]]:
    """A run of a send as the leader proposes it: unchanged when none of its messages is
    delayed; when all are, rewritten for the schedule queue. A batch (RocketMQ's rule: no
    delayed messages in a batch) or a run that mixes the two is refused (``DelayError``)."""
    dues = [due_of(m[4], now_ms, levels, max_delay_ms) if m[4] else None for m in messages]
    delayed = sum(d is not None for d in dues)
    if not delayed:
        return topic, queue_id, messages
    if batch:
        raise DelayError("a batch cannot hold delayed messages (RocketMQ's rule): send them one "
                         "by one")
    if delayed < len(messages):
        raise DelayError("a run mixes delayed and immediate messages: send them apart")
    return SCHEDULE_TOPIC, SCHEDULE_QUEUE, [schedule_message(m, topic, queue_id, d)
                                            for m, d in zip(messages, dues) if d is not None]


def schedule_message(m: list[Any], topic: str, queue_id: int, due_ms: int) -> list[Any]:
    """A message (entry form) rewritten for the schedule topic: its real topic, queue and due
    time as properties, its other properties (its ``DELAY`` level too) kept."""
    body, tags, keys, unique_key, props, born = m
    kept = [p for p in props if p[0] not in (TIMER_DELIVER_MS, REAL_TOPIC, REAL_QID)]
    return [body, tags, keys, unique_key,
            [*kept, [REAL_TOPIC, topic], [REAL_QID, str(queue_id)],
             [TIMER_DELIVER_MS, str(due_ms)]], born]


def timer_of(m: list[Any]) -> tuple[str, int, int]:
    """(real topic, real queue id, due ms) of a message stored in the schedule topic; ValueError
    if the leader's properties are missing or malformed (every replica refuses alike)."""
    props = {p[0]: p[1] for p in m[4]}
    topic = props.get(REAL_TOPIC)
    qid = natural(props.get(REAL_QID), 6)
    due = natural(props.get(TIMER_DELIVER_MS), 18)
    if not topic or qid is None or due is None:
        raise ValueError("a scheduled message needs REAL_TOPIC, REAL_QID and TIMER_DELIVER_MS")
    return topic, qid, due


class DelayIndex:
    """Pending timers by due time: ``add`` at schedule, ``take`` at delivery (once), ``due``."""

    __slots__ = ("_packed", "_open", "_ids", "_count")

    def __init__(self) -> None:
        self._packed: dict[int, bytearray] = {}  # bucket -> records in the order they came
        self._open: dict[int, dict[int, int]] = {}  # bucket -> {offset: due}, once taken from
        self._ids: list[int] = []  # buckets holding pending timers, ascending
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DelayIndex) and self.snapshot() == other.snapshot()

    def add(self, due_ms: int, offset: int) -> None:
        b = due_ms // BUCKET_MS
        opened = self._open.get(b)
        if opened is not None:
            opened[offset] = due_ms
        else:
            buf = self._packed.get(b)
            if buf is None:
                buf = self._packed[b] = bytearray()
                bisect.insort(self._ids, b)
            buf += RECORD.pack(due_ms, offset)
        self._count += 1

    def take(self, offset: int, due_ms: int) -> bool:
        """Remove the timer of ``offset`` due at ``due_ms``; False if it is not pending (taken
        already, or never scheduled at that time)."""
        b = due_ms // BUCKET_MS
        opened = self._open.get(b)
        if opened is None:
            buf = self._packed.pop(b, None)
            if buf is None:
                return False
            opened = self._open[b] = {o: d for d, o in RECORD.iter_unpack(buf)}
        if opened.get(offset) != due_ms:
            return False
        del opened[offset]
        self._count -= 1
        if not opened:
            del self._open[b]
            del self._ids[bisect.bisect_left(self._ids, b)]
        return True

    def _records(self, b: int) -> Iterable[tuple[int, int]]:
        opened = self._open.get(b)
        if opened is not None:
            return ((d, o) for o, d in opened.items())
        return RECORD.iter_unpack(self._packed[b])

    def due(self, now_ms: int, limit: int, skip: set[int] | frozenset[int] = frozenset()
            ) -> list[tuple[int, int]]:
        """Up to ``limit`` pending (due ms, offset) with due <= ``now_ms``, earliest first, but
        the offsets in ``skip`` (deliveries already proposed)."""
        out: list[tuple[int, int]] = []
        for b in self._ids:
            if b * BUCKET_MS > now_ms or len(out) >= limit:
                break
            out.extend((d, o) for d, o in self._records(b) if d <= now_ms and o not in skip)
        out.sort()
        return out[:limit]

    def next_due_ms(self) -> int | None:
        """The earliest due time pending, or None."""
        if not self._ids:
            return None
        return min(d for d, _ in self._records(self._ids[0]))

    def snapshot(self) -> list[Any]:
        """[[bucket, packed records], ...] by bucket, records in the order each bucket keeps."""
        out: list[Any] = []
        for b in self._ids:
            opened = self._open.get(b)
            if opened is not None:
                out.append([b, b"".join(RECORD.pack(d, o) for o, d in opened.items())])
            else:
                out.append([b, bytes(self._packed[b])])
        return out

    @classmethod
    def restore(cls, blob: Any) -> DelayIndex:
        index = cls()
        if not isinstance(blob, list):
            raise ValueError("malformed delay index")
        for item in blob:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], int)
                    and isinstance(item[1], bytes) and item[1]
                    and len(item[1]) % RECORD.size == 0):
                raise ValueError("malformed delay index bucket")
            b, packed = item
            if b in index._packed or any(d // BUCKET_MS != b for d, _ in RECORD.iter_unpack(packed)):
                raise ValueError(f"delay index bucket {b} is repeated or holds another's timers")
            index._packed[b] = bytearray(packed)
            index._count += len(packed) // RECORD.size
        index._ids = sorted(index._packed)
        return index


__all__ = [
    "DEFAULT_LEVELS",
    "DEFAULT_MAX_DELAY_MS",
    "SCHEDULE_TOPIC",
    "DelayError",
    "DelayIndex",
    "due_of",
    "parse_levels",
    "route_run",
    "schedule_message",
    "timer_of",
]
