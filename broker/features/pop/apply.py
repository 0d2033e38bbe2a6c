"""Applying pop consumption's entries (``broker.features.pop.entries``) to the state machine: functions
over ``BrokerState`` (its consume queues, offsets and pop table), called by its ``apply``;
pure and deterministic, as the state machine is.

After each change the group's consume offset of the queue (``state.offsets``) follows the pop
state's (the lowest offset in flight, or the cursor), so that consumer status and lag read the
same as for any other consumer group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.core.applied import ApplyResult, tag_hash
from broker.features.pop.model import PopConflict
from broker.features.pop.entries import PopAck, PopChange, PopDead, PopEntries, PopEntry

if TYPE_CHECKING:
    from broker.core.state import BrokerState


def apply_pop(state: BrokerState, index: int, position: int, e: PopEntries) -> ApplyResult:
    key = (e.group, e.topic, e.queue_id)
    pops = state.pops
    if isinstance(e, PopEntry):
        units = state.queues.get((e.topic, e.queue_id))
        first, length = (units.first(), len(units)) if units is not None else (0, 0)
        try:
            popped = pops.pop(key, index, e.store_ts_ms, e.invisible_ms, e.start, first, length,
                              e.redeliver, e.lo, e.hi, e.fresh)
        except PopConflict as err:
            return ApplyResult(index, "POP_CONFLICT", e.topic, e.queue_id, detail=str(err))
        result = ApplyResult(index, "OK", e.topic, e.queue_id, popped=tuple(popped))
    elif isinstance(e, PopAck):
        acked = pops.ack(key, e.store_ts_ms, e.entries)
        result = ApplyResult(index, "OK", e.topic, e.queue_id, acked=tuple(acked))
    elif isinstance(e, PopChange):
        if not pops.change(key, index, e.store_ts_ms, e.offset, e.epoch, e.invisible_ms):
            return ApplyResult(index, "INVALID_RECEIPT_HANDLE", e.topic, e.queue_id)
        result = ApplyResult(index, "OK", e.topic, e.queue_id)
    else:
        result = _dead(state, index, position, e)
        if result.status != "OK":
            return result
    q = pops.get(key)
    if q is not None:
        state.offsets[key] = q.committed()
    return result


def _dead(state: BrokerState, index: int, position: int, e: PopDead) -> ApplyResult:
    """The offset leaves flight and its copy goes to queue 0 of the dead-letter topic, in this
    one apply: both or neither."""
    cfg = state.topics.get(e.dlq_topic)
    if cfg is None or cfg.write_queues == 0:
        return ApplyResult(index, "TOPIC_NOT_FOUND", e.dlq_topic, detail="no dead-letter topic")
    if not state.pops.dead((e.group, e.topic, e.queue_id), e.store_ts_ms, e.offset, e.epoch):
        return ApplyResult(index, "INVALID_RECEIPT_HANDLE", e.topic, e.queue_id)
    units = state.queue(e.dlq_topic, 0)
    offset = len(units)
    units.append(position, 0, len(e.message[0]), tag_hash(e.message[1]), e.store_ts_ms)
    return ApplyResult(index, "OK", e.dlq_topic, 0, queue_offsets=(offset,))


__all__ = ["apply_pop"]
