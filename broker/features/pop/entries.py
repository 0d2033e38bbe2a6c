"""The log entries of pop consumption (``broker.features.pop.model``): their shapes, encoding and strict
decoding (a malformed committed entry is refused alike on every replica). Kinds 12-15 of the
broker's entry envelope (``broker.core.entries``, whose decoder table includes these).

- POP ``[ts, group, topic, queue id, invisible ms, start, [redelivered offset...], from, to,
  [[offset, ordered]...]]``
- POP_ACK ``[ts, group, topic, queue id, [[offset, epoch]...]]``
- POP_CHANGE ``[ts, group, topic, queue id, offset, epoch, invisible ms]``
- POP_DEAD ``[ts, group, topic, queue id, offset, epoch, dead-letter topic, message]``: the
  message copy (entry form) goes to queue 0 of the dead-letter topic, which exists before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import cbor2

import broker.core.entries as be

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
    fresh: tuple[tuple[int, bool], ...]


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


def encode_pop(e: PopEntries) -> bytes:
    head = [e.store_ts_ms, e.group, e.topic, e.queue_id]
    if isinstance(e, PopEntry):
        fields = [KIND_POP, *head, e.invisible_ms, e.start, list(e.redeliver), e.lo, e.hi,
                  [[o, ordered] for o, ordered in e.fresh]]
    elif isinstance(e, PopAck):
        fields = [KIND_POP_ACK, *head, [list(x) for x in e.entries]]
    elif isinstance(e, PopChange):
        fields = [KIND_POP_CHANGE, *head, e.offset, e.epoch, e.invisible_ms]
    else:
        fields = [KIND_POP_DEAD, *head, e.offset, e.epoch, e.dlq_topic, e.message]
    return cbor2.dumps([be.VERSION, *fields])


def _head(f: list[Any]) -> tuple[int, str, str, int]:
    return be._int(f[0]), be._str(f[1]), be._str(f[2]), be._int(f[3])


def _offsets(v: Any) -> tuple[int, ...]:
    if not isinstance(v, list) or len(v) > POP_ITEMS_MAX:
        raise ValueError(f"a list of at most {POP_ITEMS_MAX} offsets")
    return tuple(be._int(o) for o in v)


def _pop(f: list[Any]) -> PopEntry:
    ts, group, topic, qid, invisible_ms, start, redeliver, lo, hi, fresh = f
    if not isinstance(fresh, list) or len(fresh) > POP_ITEMS_MAX:
        raise ValueError(f"a pop hands out at most {POP_ITEMS_MAX} fresh offsets")
    pairs = tuple((be._int(o), be._bool(ordered)) for o, ordered in be._pairs(fresh, "[offset, ordered]"))
    lo, hi = be._int(lo), be._int(hi)
    if hi < lo:
        raise ValueError("a pop's range ends before it starts")
    return PopEntry(*_head([ts, group, topic, qid]), be._int(invisible_ms), be._int(start),
                    _offsets(redeliver), lo, hi, pairs)


def _ack(f: list[Any]) -> PopAck:
    ts, group, topic, qid, items = f
    pairs = be._pairs(items, "[offset, epoch]")
    if not pairs or len(pairs) > POP_ITEMS_MAX:
        raise ValueError(f"an ack names 1..{POP_ITEMS_MAX} offsets")
    return PopAck(*_head([ts, group, topic, qid]),
                  tuple((be._int(o), be._int(e)) for o, e in pairs))


def _change(f: list[Any]) -> PopChange:
    ts, group, topic, qid, offset, epoch, invisible_ms = f
    return PopChange(*_head([ts, group, topic, qid]), be._int(offset), be._int(epoch),
                     be._int(invisible_ms))


def _dead(f: list[Any]) -> PopDead:
    ts, group, topic, qid, offset, epoch, dlq, message = f
    be.check_message(message)
    return PopDead(*_head([ts, group, topic, qid]), be._int(offset), be._int(epoch),
                   be._str(dlq), message)


DECODERS: dict[int, Callable[[list[Any]], Any]] = {
    KIND_POP: _pop, KIND_POP_ACK: _ack, KIND_POP_CHANGE: _change, KIND_POP_DEAD: _dead}
be._DECODERS.update(DECODERS)  # decode() and decode_for_apply() know the pop kinds from here on
# A dead letter is stored by its PopDead entry: the key index and message query find it.
be.STORED_BY_TYPE[PopDead] = lambda e: (e.store_ts_ms, [(e.dlq_topic, 0, [e.message])])

__all__ = ["DECODERS", "KIND_POP", "KIND_POP_ACK", "KIND_POP_CHANGE", "KIND_POP_DEAD", "PopAck",
           "PopChange", "PopDead", "PopEntries", "PopEntry", "encode_pop"]
