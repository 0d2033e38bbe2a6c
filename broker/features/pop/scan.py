"""The leader's reading of a queue for a pop (``broker.features.pop.service``): which fresh
messages from the cursor a receive hands out, holds back, parks or passes. Leader-side, not
replicated: what it decides goes into the pop entry, which every replica applies alike.

- A message is passed (its offset skipped) when the receiver's tag or SQL92 filter refuses it,
  or when its TTL has passed by this leader's clock (``broker.core.read_filter``, as a pull's).
- In queue order (``scan_in_order``): an ordered message (its message group) whose group is
  busy is held back (FIFO, ``broker.features.pop.model``); the others are handed out.
- By priority (``scan_by_priority``, RocketMQ 5.4's priority messages, ``protocol.priority``):
  when a message of a higher priority lies within ``LOOKAHEAD_UNITS`` of the cursor, or the
  group has messages parked, a pop takes the parked and the fresh ones highest priority first
  (lowest offset first among equals) and parks the fresh ones it passed. A scan by priority
  stops before the first ordered message (FIFO messages carry no priority; the next scan in
  queue order takes them). ``PriorityMemo`` remembers, per group and queue, the offsets of
  priority above 0 it has seen ahead of the cursor, so that each message is read for its
  priority once.
"""

from __future__ import annotations

from typing import Any, Protocol

from broker.core.codec import Message
from broker.core.read_filter import ReadFilter
from broker.features.pop.entries import POP_ITEMS_MAX
from broker.features.pop.model import GroupGate, PopKey
from broker.machine.state import BrokerState
from protocol.consume_rules import MESSAGE_GROUP_PROPERTY
from protocol.priority import priority_of

SCAN_UNITS_MAX = 1024  # units one pop examines from the cursor (filtered ones included)
LOOKAHEAD_UNITS = POP_ITEMS_MAX  # how far past the cursor a higher priority is looked for

Fresh = list[tuple[int, str | None]]  # (offset, its message group if ordered)


class ScanHost(Protocol):
    @property
    def state(self) -> BrokerState: ...

    def read_message(self, position: int, slot: int, entries: dict[int, list[Any]]) -> Message: ...


def group_of_message(m: Message) -> str | None:
    return next((v for n, v in m.properties if n == MESSAGE_GROUP_PROPERTY), None) \
        if m.properties else None


def scan_in_order(host: ScanHost, topic: str, qid: int, lo: int, length: int, room: int,
                  capacity: int, f: ReadFilter, gate: GroupGate
                  ) -> tuple[Fresh, list[tuple[int, str]], int]:
    """Fresh offsets from ``lo``: (offset, message group) of each to hand out (at most
    ``room``), (offset, group) of each ordered one to hold back behind an earlier message of
    its group (both together at most ``capacity``), and where the cursor moves: past each one
    handed out, held back or passed."""
    if room <= 0 or lo >= length:
        return [], [], lo
    entries: dict[int, list[Any]] = {}
    fresh: Fresh = []
    held: list[tuple[int, str]] = []
    hi = lo
    for k, unit in enumerate(host.state.units(topic, qid, lo, SCAN_UNITS_MAX)):
        off = lo + k
        m = f.examine(host, unit, entries)
        if m is None:
            hi = off + 1
            continue
        group = group_of_message(m)
        if group is not None and not gate.free(group):
            if len(held) >= POP_ITEMS_MAX:
                break
            held.append((off, group))  # it waits behind an earlier one of its group
        else:
            fresh.append((off, group))
            if group is not None:
                gate.take(group)
        hi = off + 1
        if len(fresh) >= room or len(fresh) + len(held) >= capacity:
            break
    return fresh, held, hi


class PriorityMemo:
    """Per (group, topic, queue): how far past the cursor messages were read for their
    priority, and the offsets of priority above 0 found there."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[PopKey, tuple[int, int, dict[int, int]]] = {}  # start, end, found

    def ahead(self, host: ScanHost, key: PopKey, lo: int, length: int) -> dict[int, int]:
        """The offsets in ``[lo, lo + LOOKAHEAD_UNITS)`` with a priority above 0."""
        _, topic, qid = key
        end = min(length, lo + LOOKAHEAD_UNITS)
        start, scanned, found = self._seen.get(key, (lo, lo, {}))
        if lo < start or scanned > length or lo > scanned:  # reset, recreated, or jumped
            scanned, found = lo, {}
        entries: dict[int, list[Any]] = {}
        for k, unit in enumerate(host.state.units(topic, qid, scanned, max(0, end - scanned))):
            m = host.read_message(unit.position, unit.slot, entries)
            p = priority_of(m.properties) if m.properties else 0
            if p:
                found[scanned + k] = p
        found = {o: p for o, p in found.items() if o >= lo}
        self._seen[key] = (lo, max(scanned, end), found)
        return {o: p for o, p in found.items() if o < end}


def scan_by_priority(host: ScanHost, topic: str, qid: int, lo: int, length: int, room: int,
                     capacity: int, f: ReadFilter, parked: dict[int, int], ahead: dict[int, int]
                     ) -> tuple[Fresh, list[tuple[int, int]], list[int], int] | None:
    """The fresh offsets to hand out, the fresh ones to park (with their priority), the parked
    ones to hand out, and where the cursor moves; None when the plan would hand out nothing (an
    ordered message first) or hold more than ``capacity``: the scan in queue order goes
    instead. It reads up to the last of the ``room`` highest priorities ahead (by the memo),
    and on until it has ``room`` messages it may hand out."""
    top = sorted((-p, o) for o, p in ahead.items())[:room]
    last = max((o for _, o in top), default=lo - 1)
    entries: dict[int, list[Any]] = {}
    eligible: list[tuple[int, int]] = []  # (offset, priority)
    examined = lo
    expired_before, expired_at = f.expired, []  # (counted only below where the cursor moves)
    for k, unit in enumerate(host.state.units(topic, qid, lo, min(LOOKAHEAD_UNITS, length - lo))):
        off = lo + k
        if off > last and len(eligible) >= room:
            break
        counted = f.expired
        m = f.examine(host, unit, entries)
        if f.expired > counted:
            expired_at.append(off)
        if m is not None and group_of_message(m) is not None:
            break  # an ordered message: FIFO's rule, in queue order, takes it from here
        examined = off + 1
        if m is not None:
            eligible.append((off, priority_of(m.properties) if m.properties else 0))
    pool = sorted([(-p, o, True) for o, p in parked.items()]
                  + [(-p, o, False) for o, p in eligible])[:room]
    if not pool:
        f.expired = expired_before  # (the scan in queue order examines them again)
        return None
    unpark = [o for _, o, was_parked in pool if was_parked]
    fresh = sorted(o for _, o, was_parked in pool if not was_parked)
    hi = examined if len(fresh) == len(eligible) else (fresh[-1] + 1 if fresh else lo)
    taken = set(fresh)
    park = [(o, p) for o, p in eligible if o < hi and o not in taken]
    if len(fresh) + len(park) > capacity or len(park) > POP_ITEMS_MAX:
        f.expired = expired_before
        return None
    f.expired -= sum(1 for o in expired_at if o >= hi)  # examined again by a later receive
    return [(o, None) for o in fresh], park, unpark, hi


__all__ = ["LOOKAHEAD_UNITS", "SCAN_UNITS_MAX", "PriorityMemo", "scan_by_priority",
           "scan_in_order"]
