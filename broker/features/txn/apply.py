"""Applying transactions (``broker.features.txn.model``) to the state machine: a run of half
messages, a transaction's end and the leader's check-backs. Functions over the core state (its
consume queues, dedup table, topics and offsets) and the feature's ``TxnTable`` (kept under
``txn``); pure and deterministic. ``KINDS`` registers the end and check entries once; ``ROUTES``
gives the half topic's sends to ``apply_half``.
"""

from __future__ import annotations

from typing import Any

from broker.core.applied import ApplyResult, tag_hash
from broker.core.entries import StoredSend
from broker.core.registry import EntryKind, StoredTopics
from broker.core.state import CoreState, TopicRoute
from broker.features.txn.entries import (
    KIND_TXN_CHECK,
    KIND_TXN_END,
    TxnCheck,
    TxnEnd,
    decode_txn_check,
    decode_txn_end,
    encode_txn_check,
    encode_txn_end,
    txn_end_messages,
)
from broker.features.txn.model import (
    CHECK_MAX_TOPIC,
    COMMIT,
    HALF_QUEUE,
    HALF_TOPIC,
    ROLLBACK,
    TxnTable,
    half_of,
)
from protocol.broker_errors import BrokerError
from protocol.topics import TopicConfig, validate_config

__all__ = ["KINDS", "PART", "ROUTES", "TXN_STATE_CANARIES", "apply_check", "apply_end", "apply_half"]

PART = "txn"  # the TxnTable's name in the state and its checkpoints
# Seeded bug (tests only): "txn_half_visible" stores a half message in its real queue too,
# visible before its transaction commits.
TXN_STATE_CANARIES = frozenset({"txn_half_visible"})


def apply_half(state: CoreState, index: int, position: int, e: StoredSend,
               first_slot: int) -> ApplyResult:
    """A run of half messages (``broker.features.txn.model``; the leader rewrote them): each
    stored in the half queue and added to its open transaction, or the run refused whole (a
    transaction decided already, or another producer group's). Answers with the real queue ids."""
    try:
        halves = [half_of(m) for m in e.messages]  # all or nothing: checked first
    except (ValueError, TypeError) as err:
        return ApplyResult(index, "BAD_ENTRY", e.topic, detail=str(err), first_slot=first_slot)
    txns = state.part(PART, TxnTable)
    for _, _, group, txn_id in halves:
        refusal = txns.refusal(txn_id, group)
        if refusal is not None:
            return ApplyResult(index, refusal, e.topic, detail=txn_id, first_slot=first_slot)
    visible = "txn_half_visible" in state.config.canaries

    def stored(k: int, offset: int) -> None:
        topic, real_qid, group, txn_id = halves[k]
        txns.add_half(txn_id, group, offset, e.store_ts_ms)
        if visible and topic in state.topics:  # the canary: readable before its commit
            m = e.messages[k]
            state.queue(topic, real_qid).append(position, first_slot + k, len(m[0]),
                                                tag_hash(m[1]), e.store_ts_ms)

    return state.store(index, position, HALF_TOPIC, HALF_QUEUE, e.messages, e.store_ts_ms,
                       first_slot, real_qids=[h[1] for h in halves], stored=stored)


def apply_end(state: CoreState, index: int, position: int, e: TxnEnd) -> ApplyResult:
    """A transaction's end, decided by whichever end entry the log orders first: a later
    one of the same decision answers OK (a retried END), of the other TXN_ALREADY_DECIDED.
    A commit whose consumer offsets moved since (another consumer, a zombie) rolls back. A
    commit of offsets alone (no half message: a pipeline's input that made no output) is a
    transaction opened and ended by its end entry."""
    txns = state.part(PART, TxnTable)
    txn = txns.open.get(e.txn_id)
    if txn is None and not e.halves and e.txn_id not in txns.decided:
        txn = txns.open_empty(e.txn_id, e.producer_group, e.store_ts_ms)  # offsets only
    if txn is None or txn.producer_group != e.producer_group:
        prior = txns.decided.get(e.txn_id) if txn is None else None
        if prior is None:
            return ApplyResult(index, "TXN_NOT_FOUND", detail=e.txn_id)
        if prior != e.decision:
            return ApplyResult(index, "TXN_ALREADY_DECIDED", detail=prior)
        return ApplyResult(index, "OK", detail=prior)
    if tuple(txn.halves) != e.halves:  # a half message joined after the leader looked
        return ApplyResult(index, "TXN_CHANGED", detail=e.txn_id)
    if e.decision == ROLLBACK:
        txns.decide(e.txn_id, ROLLBACK)
        if e.check_max:
            _store_copies(state, position, e, [(CHECK_MAX_TOPIC, 0, m) for _, _, m in e.items])
        return ApplyResult(index, "OK", detail=ROLLBACK)
    for group, topic, qid, expected, _ in e.offsets:
        if state.offsets.get((group, topic, qid), -1) != expected:
            txns.decide(e.txn_id, ROLLBACK)
            return ApplyResult(index, "OFFSET_CONFLICT",
                               detail=f"{group} {topic}/{qid} moved from {expected}")
    txns.decide(e.txn_id, COMMIT)
    runs = _store_copies(state, position, e, list(e.items))
    for group, topic, qid, _, new in e.offsets:
        state.offsets[(group, topic, qid)] = new
    return ApplyResult(index, "SEND_OK", detail=COMMIT, runs=tuple(runs))


def _store_copies(state: CoreState, position: int, e: TxnEnd,
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
        units = state.queue(topic, qid)
        out.append(ApplyResult(0, "SEND_OK", topic, qid, (len(units),), first_slot=slot))
        units.append(position, slot, len(m[0]), tag_hash(m[1]), e.store_ts_ms)
    return out


def apply_check(state: CoreState, index: int, position: int, e: TxnCheck) -> ApplyResult:
    txns = state.part(PART, TxnTable)
    for txn_id, checks in e.checks:
        txns.count_check(txn_id, checks, e.store_ts_ms)
    return ApplyResult(index, "OK")


def _stored(e: TxnEnd) -> StoredTopics:
    # A commit's copies for their real queues (a rollback after the last check-back stores
    # them in the check-max topic instead: the consume queues tell, at query time).
    return e.store_ts_ms, [(topic, qid, [m]) for topic, qid, m in e.items]


KINDS = (EntryKind("txn_end", (KIND_TXN_END,), (TxnEnd,), encode_txn_end, decode_txn_end,
                   apply_end, stored=_stored, messages=txn_end_messages),
         EntryKind("txn_check", (KIND_TXN_CHECK,), (TxnCheck,), encode_txn_check,
                   decode_txn_check, apply_check))
ROUTES: dict[str, TopicRoute] = {HALF_TOPIC: apply_half}
