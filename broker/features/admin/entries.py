"""The log entries of consumer-group administration, strictly decoded: OFFSET_RESET (kind 11)
``[group, topic, [[queue id, offset]...]]`` and SUBSCRIPTION_GROUP_PUT (kind 20) ``[ts, group,
max delivery attempts or null]`` (a consumer group's setting, ``broker.features.admin.model``;
null: back to the broker's default)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.core.codec import as_int, as_pairs, as_str, dump
from broker.features.admin.model import GROUP_MAX_CHARS, check_attempts

__all__ = ["KIND_OFFSET_RESET", "KIND_SUBSCRIPTION_GROUP_PUT", "OffsetReset",
           "SubscriptionGroupPut", "decode_offset_reset", "decode_subscription_group_put",
           "encode_offset_reset", "encode_subscription_group_put"]

KIND_OFFSET_RESET = 11
KIND_SUBSCRIPTION_GROUP_PUT = 20


@dataclass(frozen=True, slots=True)
class OffsetReset:
    """An admin's reset of a consumer group's offsets on several queues of one topic at once
    (``dledger consumer reset-offset``): all of them or none, in one entry."""

    group: str
    topic: str
    offsets: tuple[tuple[int, int], ...]  # (queue id, the next offset to consume)


def encode_offset_reset(e: OffsetReset) -> bytes:
    return dump(KIND_OFFSET_RESET, [e.group, e.topic, [list(q) for q in e.offsets]])


def decode_offset_reset(number: int, f: list[Any]) -> OffsetReset:
    group, topic, offsets = f
    out = tuple((as_int(q), as_int(o)) for q, o in as_pairs(offsets, "[queue id, offset]"))
    if not out:
        raise ValueError("a reset carries at least one [queue id, offset]")
    return OffsetReset(as_str(group), as_str(topic), out)


@dataclass(frozen=True, slots=True)
class SubscriptionGroupPut:
    """An operator's setting for a consumer group (``dledger consumer retry-policy``): its
    maximum delivery attempts, or None to take the broker's default again."""

    store_ts_ms: int
    group: str
    max_delivery_attempts: int | None


def encode_subscription_group_put(e: SubscriptionGroupPut) -> bytes:
    return dump(KIND_SUBSCRIPTION_GROUP_PUT, [e.store_ts_ms, e.group, e.max_delivery_attempts])


def decode_subscription_group_put(number: int, f: list[Any]) -> SubscriptionGroupPut:
    ts, group, attempts = f
    group = as_str(group, "the consumer group")
    if not 0 < len(group) <= GROUP_MAX_CHARS:
        raise ValueError(f"a consumer group's name has 1..{GROUP_MAX_CHARS} characters")
    return SubscriptionGroupPut(as_int(ts), group, check_attempts(attempts))
