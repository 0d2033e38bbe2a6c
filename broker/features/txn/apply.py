"""Applying transactions (``broker.features.txn.model``) to the state machine: a run of half messages, and a
transaction's end. Functions over ``BrokerState`` (its consume queues, dedup table, topics and
transaction table), called by its ``apply``; pure and deterministic, as the state machine is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.core.applied import ApplyResult, tag_hash
from broker.core.consumequeue import UnitQueue
from broker.core.entries import StoredSend, TxnEnd
from protocol.broker_errors import BrokerError
from protocol.topics import TopicConfig, validate_config
from broker.features.txn.model import CHECK_MAX_TOPIC, COMMIT, HALF_QUEUE, HALF_TOPIC, ROLLBACK, half_of

if TYPE_CHECKING:
    from broker.core.state import BrokerState


def apply_half(state: BrokerState, index: int, position: int, e: StoredSend,
               first_slot: int) -> ApplyResult:
    """A run of half messages (``broker.features.txn.model``; the leader rewrote them): each stored in the
    half queue and added to its open transaction, or the run refused whole (a transaction
    decided already, or another producer group's). Answers with the real queue ids."""
    try:
        halves = [half_of(m) for m in e.messages]  # all or nothing: checked first
    except (ValueError, TypeError) as err:
        return ApplyResult(index, "BAD_ENTRY", e.topic, detail=str(err), first_slot=first_slot)
    for _, _, group, txn_id in halves:
        refusal = state.txns.refusal(txn_id, group)
        if refusal is not None:
            return ApplyResult(index, refusal, e.topic, detail=txn_id, first_slot=first_slot)
    state.dedup.expire(e.store_ts_ms)
    units = state.queue(HALF_TOPIC, HALF_QUEUE)
    visible = "txn_half_visible" in state.config.canaries
    offsets: list[int] = []
    dups: list[bool] = []
    qids: list[int] = []
    originals: list[tuple[int, int, int]] = []
    for k, (m, (topic, real_qid, group, txn_id)) in enumerate(zip(e.messages, halves)):
        unique_key = m[3]
        seen = state.dedup.lookup_or_add(unique_key, HALF_TOPIC, real_qid, len(units),
                                         e.store_ts_ms) if unique_key else None
        qids.append(real_qid)
        if seen is not None:
            offsets.append(seen[2])
            dups.append(True)
            originals.extend(state.original(k, HALF_TOPIC, seen[1], seen[2]))
            continue
        offset = len(units)
        units.append(position, first_slot + k, len(m[0]), tag_hash(m[1]), e.store_ts_ms)
        state.txns.add_half(txn_id, group, offset, e.store_ts_ms)
        if visible and topic in state.topics:  # the canary: readable before its commit
            queue_of(state, topic, real_qid).append(position, first_slot + k, len(m[0]),
                                                    tag_hash(m[1]), e.store_ts_ms)
        offsets.append(offset)
        dups.append(False)
    return ApplyResult(index, "SEND_OK", HALF_TOPIC, HALF_QUEUE, tuple(offsets), tuple(dups),
                       tuple(qids), first_slot=first_slot, originals=tuple(originals))


def apply_end(state: BrokerState, index: int, position: int, e: TxnEnd) -> ApplyResult:
    """A transaction's end, decided by whichever end entry the log orders first: a later
    one of the same decision answers OK (a retried END), of the other TXN_ALREADY_DECIDED.
    A commit whose consumer offsets moved since (another consumer, a zombie) rolls back. A
    commit of offsets alone (no half message: a pipeline's input that made no output) is a
    transaction opened and ended by its end entry."""
    txn = state.txns.open.get(e.txn_id)
    if txn is None and not e.halves and e.txn_id not in state.txns.decided:
        txn = state.txns.open_empty(e.txn_id, e.producer_group, e.store_ts_ms)  # offsets only
    if txn is None or txn.producer_group != e.producer_group:
        prior = state.txns.decided.get(e.txn_id) if txn is None else None
        if prior is None:
            return ApplyResult(index, "TXN_NOT_FOUND", detail=e.txn_id)
        if prior != e.decision:
            return ApplyResult(index, "TXN_ALREADY_DECIDED", detail=prior)
        return ApplyResult(index, "OK", detail=prior)
    if tuple(txn.halves) != e.halves:  # a half message joined after the leader looked
        return ApplyResult(index, "TXN_CHANGED", detail=e.txn_id)
    if e.decision == ROLLBACK:
        state.txns.decide(e.txn_id, ROLLBACK)
        if e.check_max:
            _store_copies(state, position, e, [(CHECK_MAX_TOPIC, 0, m) for _, _, m in e.items])
        return ApplyResult(index, "OK", detail=ROLLBACK)
    for group, topic, qid, expected, _ in e.offsets:
        if state.offsets.get((group, topic, qid), -1) != expected:
            state.txns.decide(e.txn_id, ROLLBACK)
            return ApplyResult(index, "OFFSET_CONFLICT",
                               detail=f"{group} {topic}/{qid} moved from {expected}")
    state.txns.decide(e.txn_id, COMMIT)
    runs = _store_copies(state, position, e, list(e.items))
    for group, topic, qid, _, new in e.offsets:
        state.offsets[(group, topic, qid)] = new
    return ApplyResult(index, "SEND_OK", detail=COMMIT, runs=tuple(runs))


def _store_copies(state: BrokerState, position: int, e: TxnEnd,
                  items: list[tuple[str, int, list[Any]]]) -> list[ApplyResult]:
    """The end entry's copies (slot = place in the entry) appended to their queues; a
    topic deleted since is created again if the leader auto-creates topics (the check-max
    topic always is), else the copy is dropped with its topic."""
    out: list[ApplyResult] = []
    for slot, (topic, qid, m) in enumerate(items):
        cfg = state.topics.get(topic)
        if cfg is None and (e.auto_create or topic == CHECK_MAX_TOPIC):
            try:
                cfg = state.topics[topic] = validate_config(
                    TopicConfig(topic, e.default_queues, e.default_queues), allow_system=True)
            except BrokerError:
                cfg = None
        if cfg is None or cfg.write_queues == 0:
            out.append(ApplyResult(0, "TOPIC_NOT_FOUND", topic, qid, first_slot=slot))
            continue
        qid %= cfg.write_queues
        units = queue_of(state, topic, qid)
        out.append(ApplyResult(0, "SEND_OK", topic, qid, (len(units),), first_slot=slot))
        units.append(position, slot, len(m[0]), tag_hash(m[1]), e.store_ts_ms)
    return out


def queue_of(state: BrokerState, topic: str, queue_id: int) -> UnitQueue:
    return state.queue(topic, queue_id)


__all__ = ["apply_end", "apply_half", "queue_of"]
