"""Applying consumer-group administration: an admin's offset reset (every queue's offset set,
or none: its topic is gone) and a consumer group's setting (in the feature's
``SubscriptionGroups``, kept under ``subscription_groups``). Pure and deterministic; ``KINDS``
registers each entry once."""

from __future__ import annotations

from broker.core.applied import ApplyResult
from broker.core.registry import EntryKind
from broker.core.state import CoreState
from broker.features.admin.entries import (
    KIND_OFFSET_RESET,
    KIND_SUBSCRIPTION_GROUP_PUT,
    OffsetReset,
    SubscriptionGroupPut,
    decode_offset_reset,
    decode_subscription_group_put,
    encode_offset_reset,
    encode_subscription_group_put,
)
from broker.features.admin.model import SubscriptionGroups

__all__ = ["KINDS", "PART", "apply_offset_reset", "apply_subscription_group_put"]

PART = "subscription_groups"  # the SubscriptionGroups' name in the state and its checkpoints


def apply_offset_reset(state: CoreState, index: int, position: int,
                       e: OffsetReset) -> ApplyResult:
    if e.topic not in state.topics:
        return ApplyResult(index, "TOPIC_NOT_FOUND", topic=e.topic)
    for queue_id, offset in e.offsets:
        state.set_offset((e.group, e.topic, queue_id), offset)
    return ApplyResult(index, "OK", topic=e.topic)


def apply_subscription_group_put(state: CoreState, index: int, position: int,
                                 e: SubscriptionGroupPut) -> ApplyResult:
    return ApplyResult(index, state.part(PART, SubscriptionGroups).put(e.group,
                                                                       e.max_delivery_attempts))


KINDS = (EntryKind("offset_reset", (KIND_OFFSET_RESET,), (OffsetReset,), encode_offset_reset,
                   decode_offset_reset, apply_offset_reset),
         EntryKind("subscription_group_put", (KIND_SUBSCRIPTION_GROUP_PUT,),
                   (SubscriptionGroupPut,), encode_subscription_group_put,
                   decode_subscription_group_put, apply_subscription_group_put))
