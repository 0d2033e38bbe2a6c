"""The log entry of consumer-group administration: OFFSET_RESET (kind 11) ``[group, topic,
[[queue id, offset]...]]``, strictly decoded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.core.codec import as_int, as_pairs, as_str, dump

__all__ = ["KIND_OFFSET_RESET", "OffsetReset", "decode_offset_reset", "encode_offset_reset"]

KIND_OFFSET_RESET = 11


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
