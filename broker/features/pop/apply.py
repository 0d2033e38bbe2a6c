"""Applying pop consumption's entries (``broker.features.pop.entries``) to the state machine:
functions over the core state (its consume queues and offsets) and the feature's ``PopTable``
(kept under ``pop``); pure and deterministic. ``KINDS`` registers the four entries once.

After each change the group's consume offset of the queue (``state.offsets``) follows the pop
state's (the lowest offset in flight, or the cursor), so that consumer status and lag read the
same as for any other consumer group.
"""

from __future__ import annotations

from broker.core.applied import ApplyResult, tag_hash
from broker.core.registry import EntryKind
from broker.core.state import CoreState
from broker.features.pop.entries import (
    KIND_POP,
    KIND_POP_ACK,
    KIND_POP_CHANGE,
    KIND_POP_DEAD,
    PopAck,
    PopChange,
    PopDead,
    PopEntry,
    dead_messages,
    decode_ack,
    decode_change,
    decode_dead,
    decode_pop,
    encode_ack,
    encode_change,
    encode_dead,
    encode_pop,
)
from broker.features.pop.model import PopConflict, PopTable

__all__ = ["KINDS", "PART", "apply_ack", "apply_change", "apply_dead", "apply_pop"]

PART = "pop"  # the PopTable's name in the state and its checkpoints


def _follow(state: CoreState, key: tuple[str, str, int]) -> None:
    """The group's consume offset of the queue follows the pop state's."""
    q = state.part(PART, PopTable).get(key)
    if q is not None:
        state.offsets[key] = q.committed()


def apply_pop(state: CoreState, index: int, position: int, e: PopEntry) -> ApplyResult:
    key = (e.group, e.topic, e.queue_id)
    units = state.queues.get((e.topic, e.queue_id))
    first, length = (units.first(), len(units)) if units is not None else (0, 0)
    try:
        popped = state.part(PART, PopTable).pop(key, index, e.store_ts_ms, e.invisible_ms,
                                                e.start, first, length, e.redeliver, e.lo, e.hi,
                                                e.fresh, e.release, e.held, e.parked, e.unpark)
    except PopConflict as err:
        return ApplyResult(index, "POP_CONFLICT", e.topic, e.queue_id, detail=str(err))
    _follow(state, key)
    return ApplyResult(index, "OK", e.topic, e.queue_id, popped=tuple(popped))


def apply_ack(state: CoreState, index: int, position: int, e: PopAck) -> ApplyResult:
    key = (e.group, e.topic, e.queue_id)
    acked = state.part(PART, PopTable).ack(key, e.store_ts_ms, e.entries)
    _follow(state, key)
    return ApplyResult(index, "OK", e.topic, e.queue_id, acked=tuple(acked))


def apply_change(state: CoreState, index: int, position: int, e: PopChange) -> ApplyResult:
    key = (e.group, e.topic, e.queue_id)
    if not state.part(PART, PopTable).change(key, index, e.store_ts_ms, e.offset, e.epoch,
                                             e.invisible_ms):
        return ApplyResult(index, "INVALID_RECEIPT_HANDLE", e.topic, e.queue_id)
    _follow(state, key)
    return ApplyResult(index, "OK", e.topic, e.queue_id)


def apply_dead(state: CoreState, index: int, position: int, e: PopDead) -> ApplyResult:
    result = _dead(state, index, position, e)
    if result.status == "OK":
        _follow(state, (e.group, e.topic, e.queue_id))
    return result


def _dead(state: CoreState, index: int, position: int, e: PopDead) -> ApplyResult:
    """The offset leaves flight and its copy goes to queue 0 of the dead-letter topic, in this
    one apply: both or neither."""
    cfg = state.topics.get(e.dlq_topic)
    if cfg is None or cfg.write_queues == 0:
        return ApplyResult(index, "TOPIC_NOT_FOUND", e.dlq_topic, detail="no dead-letter topic")
    if not state.part(PART, PopTable).dead((e.group, e.topic, e.queue_id), e.store_ts_ms, e.offset, e.epoch):
        return ApplyResult(index, "INVALID_RECEIPT_HANDLE", e.topic, e.queue_id)
    units = state.queue(e.dlq_topic, 0)
    offset = len(units)
    units.append(position, 0, len(e.message[0]), tag_hash(e.message[1]), e.store_ts_ms)
    return ApplyResult(index, "OK", e.dlq_topic, 0, queue_offsets=(offset,))


KINDS = (
    EntryKind("pop", (KIND_POP,), (PopEntry,), encode_pop, decode_pop, apply_pop),
    EntryKind("pop_ack", (KIND_POP_ACK,), (PopAck,), encode_ack, decode_ack, apply_ack),
    EntryKind("pop_change", (KIND_POP_CHANGE,), (PopChange,), encode_change, decode_change,
              apply_change),
    # A dead letter is stored by its PopDead entry: the key index and message query find it.
    EntryKind("pop_dead", (KIND_POP_DEAD,), (PopDead,), encode_dead, decode_dead, apply_dead,
              stored=lambda e: (e.store_ts_ms, [(e.dlq_topic, 0, [e.message])]),
              messages=dead_messages),
)
