"""Applying queue locks: a lock entry grants each queue its member may hold (fenced: never one
another live member holds), an unlock entry releases them. Over the feature's ``LockTable``
(kept under ``orderly``); pure and deterministic. ``KINDS`` registers both entries once."""

from __future__ import annotations

from broker.core.applied import ApplyResult
from broker.core.registry import EntryKind
from broker.core.state import CoreState
from broker.features.orderly.entries import (
    KIND_LOCK_QUEUES,
    KIND_UNLOCK_QUEUES,
    LockQueues,
    decode_lock_queues,
    encode_lock_queues,
)
from broker.features.orderly.model import LockTable

__all__ = ["KINDS", "ORDERLY_STATE_CANARIES", "PART", "apply_lock_queues"]

PART = "orderly"  # the LockTable's name in the state and its checkpoints
# Seeded bug (tests only): "lock_unfenced" grants a queue lock whoever holds it.
ORDERLY_STATE_CANARIES = frozenset({"lock_unfenced"})


def apply_lock_queues(state: CoreState, index: int, position: int,
                      e: LockQueues) -> ApplyResult:
    locks = state.part(PART, LockTable)
    if not e.lock:
        locks.unlock(e.group, e.client_id, e.queues, e.store_ts_ms)
        return ApplyResult(index, "OK")
    granted = locks.lock(e.group, e.client_id, e.queues, e.store_ts_ms, e.ttl_ms,
                         fenced="lock_unfenced" not in state.config.canaries)
    return ApplyResult(index, "OK", granted=tuple(granted))


KINDS = (EntryKind("lock_queues", (KIND_LOCK_QUEUES, KIND_UNLOCK_QUEUES), (LockQueues,),
                   encode_lock_queues, decode_lock_queues, apply_lock_queues),)
