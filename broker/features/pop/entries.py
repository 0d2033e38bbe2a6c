"""The log entries of pop consumption (``broker.features.pop.model``): their shapes, encoding and strict
decoding (a malformed committed entry is refused alike on every replica). Kinds 12-15 of the
broker's entry envelope (``broker.core.codec``; registered by ``broker.features.pop.apply``).

- POP ``[ts, group, topic, queue id, invisible ms, start, [redelivered offset...], from, to,
  [[offset, message group or false]...], [[held offset, message group]...], [released
  offset...], [[parked offset, priority]...], [unparked offset...]]``. Entries written
  before priorities end after the released offsets; entries written before per-group FIFO
  end after the fresh offsets, and say of each only whether it is ordered (true: its group
  unnamed, ``broker.features.pop.model.WHOLE_QUEUE``).
- POP_ACK ``[ts, group, topic, queue id, [[offset, epoch]...]]``
- POP_CHANGE ``[ts, group, topic, queue id, offset, epoch, invisible ms]``
- POP_DEAD ``[ts, group, topic, queue id, offset, epoch, dead-letter topic, message]``: the
  message copy (entry form) goes to queue 0 of the dead-letter topic, which exists before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.core.codec import as_int, as_pairs, as_str, check_message, dump
from broker.features.pop.model import group_of

KIND_POP = 12
KIND_POP_ACK = 13
KIND_POP_CHANGE = 14
KIND_POP_DEAD = 15
POP_ITEMS_MAX = 1024  # offsets one pop or ack entry may name


@dataclass(frozen=True, slots=True)
class PopEntry:
    store_ts_ms: int
    group: str
    topic: str
    queue_id: int
    invisible_ms: int
    start: int  # where the group's cursor starts if it never popped this queue
    redeliver: tuple[int, ...]
    lo: int
    hi: int
    fresh: tuple[tuple[int, str | None], ...]  # (offset, its message group if ordered)
    held: tuple[tuple[int, str], ...] = ()  # (offset, group): held back behind its group
    release: tuple[int, ...] = ()  # held back before, handed out now
    parked: tuple[tuple[int, int], ...] = ()  # (offset, priority): passed for a higher one
    unpark: tuple[int, ...] = ()  # parked before, handed out now


@dataclass(frozen=True, slots=True)
class PopAck:
    store_ts_ms: int
    group: str
    topic: str
    queue_id: int
    entries: tuple[tuple[int, int], ...]  # (offset, epoch)


@dataclass(frozen=True, slots=True)
class PopChange:
    store_ts_ms: int
    group: str
    topic: str
    queue_id: int
    offset: int
    epoch: int
    invisible_ms: int


@dataclass(frozen=True, slots=True)
class PopDead:
    store_ts_ms: int
    group: str
    topic: str
    queue_id: int
    offset: int
    epoch: int
    dlq_topic: str
    message: list[Any]  # entry form


PopEntries = PopEntry | PopAck | PopChange | PopDead


def _head_of(e: PopEntries) -> list[Any]:
    return [e.store_ts_ms, e.group, e.topic, e.queue_id]


def encode_pop(e: PopEntry) -> bytes:
    """A pop that names no group, holds nothing back and releases nothing is written in the
    form before per-group FIFO, which a replica not upgraded yet still reads the same."""
    fields = [*_head_of(e), e.invisible_ms, e.start, list(e.redeliver), e.lo, e.hi,
              [[o, g if g is not None else False] for o, g in e.fresh]]
    if e.held or e.release or e.parked or e.unpark or any(g is not None for _, g in e.fresh):
        fields += [[list(h) for h in e.held], list(e.release)]
    if e.parked or e.unpark:  # (only a pop of priorities has these: older pops keep their form)
        fields += [[list(p) for p in e.parked], list(e.unpark)]
    return dump(KIND_POP, fields)


def encode_ack(e: PopAck) -> bytes:
    return dump(KIND_POP_ACK, [*_head_of(e), [list(x) for x in e.entries]])


def encode_change(e: PopChange) -> bytes:
    return dump(KIND_POP_CHANGE, [*_head_of(e), e.offset, e.epoch, e.invisible_ms])


def encode_dead(e: PopDead) -> bytes:
    return dump(KIND_POP_DEAD, [*_head_of(e), e.offset, e.epoch, e.dlq_topic, e.message])


def _head(f: list[Any]) -> tuple[int, str, str, int]:
    return as_int(f[0]), as_str(f[1]), as_str(f[2]), as_int(f[3])


def _offsets(v: Any) -> tuple[int, ...]:
    if not isinstance(v, list) or len(v) > POP_ITEMS_MAX:
        raise ValueError(f"a list of at most {POP_ITEMS_MAX} offsets")
    return tuple(as_int(o) for o in v)


def decode_pop(number: int, f: list[Any]) -> PopEntry:
    ts, group, topic, qid, invisible_ms, start, redeliver, lo, hi, fresh, *fifo = f
    if len(fifo) not in (0, 2, 4):  # (0: written before per-group FIFO, 2: before priorities)
        raise ValueError("a pop's held and released offsets are both given or neither, as "
                         "are its parked and unparked ones")
    held, release, parked, unpark = [*fifo, [], [], [], []][:4]
    items: Any
    for items, what in ((fresh, "fresh"), (held, "held"), (parked, "parked")):
        if not isinstance(items, list) or len(items) > POP_ITEMS_MAX:
            raise ValueError(f"a pop names at most {POP_ITEMS_MAX} {what} offsets")
    pairs = tuple((as_int(o), group_of(g)) for o, g in as_pairs(fresh, "[offset, group]"))
    waits = tuple((as_int(o), as_str(g)) for o, g in as_pairs(held, "[offset, group]"))
    passed = tuple((as_int(o), as_int(p)) for o, p in as_pairs(parked, "[offset, priority]"))
    lo, hi = as_int(lo), as_int(hi)
    if hi < lo:
        raise ValueError("a pop's range ends before it starts")
    return PopEntry(*_head([ts, group, topic, qid]), as_int(invisible_ms), as_int(start),
                    _offsets(redeliver), lo, hi, pairs, waits, _offsets(release), passed,
                    _offsets(unpark))


def decode_ack(number: int, f: list[Any]) -> PopAck:
    ts, group, topic, qid, items = f
    pairs = as_pairs(items, "[offset, epoch]")
    if not pairs or len(pairs) > POP_ITEMS_MAX:
        raise ValueError(f"an ack names 1..{POP_ITEMS_MAX} offsets")
    return PopAck(*_head([ts, group, topic, qid]),
                  tuple((as_int(o), as_int(e)) for o, e in pairs))


def decode_change(number: int, f: list[Any]) -> PopChange:
    ts, group, topic, qid, offset, epoch, invisible_ms = f
    return PopChange(*_head([ts, group, topic, qid]), as_int(offset), as_int(epoch),
                     as_int(invisible_ms))


def decode_dead(number: int, f: list[Any]) -> PopDead:
    ts, group, topic, qid, offset, epoch, dlq, message = f
    check_message(message)
    return PopDead(*_head([ts, group, topic, qid]), as_int(offset), as_int(epoch),
                   as_str(dlq), message)


def dead_messages(f: list[Any]) -> list[Any]:
    """A stored dead letter's one message, from its fields."""
    return [f[7]]


__all__ = ["KIND_POP", "KIND_POP_ACK", "KIND_POP_CHANGE", "KIND_POP_DEAD", "PopAck", "PopChange",
           "PopDead", "PopEntries", "PopEntry", "dead_messages", "decode_ack", "decode_change",
           "decode_dead", "decode_pop", "encode_ack", "encode_change", "encode_dead", "encode_pop"]
