"""Applying an admin's offset reset: every queue's offset set, or none (its topic is gone).
Pure and deterministic; ``KINDS`` registers the entry once."""

from __future__ import annotations

from broker.core.applied import ApplyResult
from broker.core.registry import EntryKind
from broker.core.state import CoreState
from broker.features.admin.entries import (
    KIND_OFFSET_RESET,
    OffsetReset,
    decode_offset_reset,
    encode_offset_reset,
)

__all__ = ["KINDS", "apply_offset_reset"]


def apply_offset_reset(state: CoreState, index: int, position: int,
                       e: OffsetReset) -> ApplyResult:
    if e.topic not in state.topics:
        return ApplyResult(index, "TOPIC_NOT_FOUND", topic=e.topic)
    for queue_id, offset in e.offsets:
        state.set_offset((e.group, e.topic, queue_id), offset)
    return ApplyResult(index, "OK", topic=e.topic)


KINDS = (EntryKind("offset_reset", (KIND_OFFSET_RESET,), (OffsetReset,), encode_offset_reset,
                   decode_offset_reset, apply_offset_reset),)
