"""A consume queue held compactly: fixed-width units packed in one ``bytearray``, the way RocketMQ
keeps 20-byte units in its ConsumeQueue files. A unit is 28 bytes (commitlog position, slot in a
batch entry, body size, tag hash, store time) instead of a Python object per message, so a queue of
a million messages is 28 MB, appending a unit is one ``struct`` pack, and a checkpoint copies the
queue as one byte string.

Reads return ``CQUnit`` values; ``queue[i]`` and ``queue[a:b]`` work like a list of them, so
``bisect`` with a key searches it without unpacking the whole queue.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator, overload

UNIT = struct.Struct("<QIIIQ")  # position, slot, size, tag hash, store time (ms)
UNIT_BYTES = UNIT.size


@dataclass(frozen=True, slots=True)
class CQUnit:
    """One message in a consume queue: where its entry is in the commitlog and which message
    of the entry it is (a batch entry holds several)."""

    position: int
    slot: int
    size: int
    tag_hash: int
    store_ts_ms: int


class ConsumeQueue:
    __slots__ = ("_buf",)

    def __init__(self, packed: bytes = b"") -> None:
        if len(packed) % UNIT_BYTES:
            raise ValueError(f"consume queue of {len(packed)} bytes is not whole {UNIT_BYTES}-byte units")
        self._buf = bytearray(packed)

    def append(self, position: int, slot: int, size: int, tag_hash: int, store_ts_ms: int) -> None:
        self._buf += UNIT.pack(position, slot, size, tag_hash, store_ts_ms)

    def __len__(self) -> int:
        return len(self._buf) // UNIT_BYTES

    @overload
    def __getitem__(self, i: int) -> CQUnit: ...

    @overload
    def __getitem__(self, i: slice) -> list[CQUnit]: ...

    def __getitem__(self, i: int | slice) -> CQUnit | list[CQUnit]:
        if isinstance(i, slice):
            lo, hi, step = i.indices(len(self))
            if step != 1:
                raise ValueError("consume queue slices take no step")
            return [CQUnit(*u) for u in UNIT.iter_unpack(self._buf[lo * UNIT_BYTES:max(lo, hi) * UNIT_BYTES])]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("consume queue offset out of range")
        return CQUnit(*UNIT.unpack_from(self._buf, i * UNIT_BYTES))

    def __iter__(self) -> Iterator[CQUnit]:
        return iter(self[0:len(self)])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConsumeQueue) and self._buf == other._buf

    def packed(self) -> bytes:
        """The units as stored (for checkpoints)."""
        return bytes(self._buf)
