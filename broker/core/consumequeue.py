"""Consume queues: fixed-width units, the way RocketMQ keeps 20-byte units in its ConsumeQueue
files. A unit is 28 bytes (commitlog position, slot in a batch entry, body size, tag hash, store
time), never a Python object per message.

``UnitQueue`` is what the state machine and the readers see: ``append``, ``len``, ``first`` (the
oldest offset still held), and ``queue[i]`` / ``queue[a:b]`` like a list of ``CQUnit`` (so
``bisect`` with a key searches it without unpacking it all). Two kinds keep the units:
- ``ConsumeQueue``: in one ``bytearray`` (the simulator and tests, which have no files);
- ``broker.core.cq_files.FileConsumeQueue``: in files of fixed units per queue, read through the page
  cache, with only the units not yet written in memory (a broker process).

A ``QueueStore`` makes queues of one kind and says how a checkpoint records them: the memory kind
copies the units into the checkpoint; the file kind records where its files end. Each queue has a
number the state machine assigns in apply order (the same on every replica), which names its
files.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, overload

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


class UnitQueue:
    """A queue of units from offset ``first()`` to ``len(queue)`` (exclusive)."""

    __slots__ = ("no", "crc")

    def __init__(self, no: int, crc: int = 0) -> None:
        self.no = no  # the state machine's number for this queue
        self.crc = crc  # CRC32 of every unit appended, from offset 0 (to compare replicas)

    def append(self, position: int, slot: int, size: int, tag_hash: int, store_ts_ms: int) -> None:
        unit = UNIT.pack(position, slot, size, tag_hash, store_ts_ms)
        self.crc = zlib.crc32(unit, self.crc)
        self._append(unit)

    def append_packed(self, units: bytes | bytearray) -> None:
        """Units packed as ``append`` packs them, one after the other (a run's, at once)."""
        if units:
            self.crc = zlib.crc32(units, self.crc)
            self._append(units)

    def _append(self, units: bytes | bytearray) -> None:
        raise NotImplementedError

    def _read(self, lo: int, hi: int) -> bytes:
        """The packed units ``lo`` .. ``hi`` (within ``first()`` .. ``len``)."""
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def first(self) -> int:
        return 0

    @overload
    def __getitem__(self, i: int) -> CQUnit: ...

    @overload
    def __getitem__(self, i: slice) -> list[CQUnit]: ...

    def __getitem__(self, i: int | slice) -> CQUnit | list[CQUnit]:
        if isinstance(i, slice):
            lo, hi, step = i.indices(len(self))
            if step != 1:
                raise ValueError("consume queue slices take no step")
            lo = max(lo, self.first())
            if hi <= lo:
                return []
            return [CQUnit(*u) for u in UNIT.iter_unpack(self._read(lo, hi))]
        n = len(self)
        if i < 0:
            i += n
        if not self.first() <= i < n:
            raise IndexError("consume queue offset out of range")
        return CQUnit(*UNIT.unpack(self._read(i, i + 1)))

    def __iter__(self) -> Iterator[CQUnit]:
        return iter(self[0:len(self)])


class ConsumeQueue(UnitQueue):
    """Units in memory, packed in one ``bytearray``."""

    __slots__ = ("_buf",)

    def __init__(self, packed: bytes = b"", no: int = 0) -> None:
        if len(packed) % UNIT_BYTES:
            raise ValueError(f"consume queue of {len(packed)} bytes is not whole {UNIT_BYTES}-byte units")
        super().__init__(no, zlib.crc32(packed))
        self._buf = bytearray(packed)

    def _append(self, units: bytes | bytearray) -> None:
        self._buf += units

    def _read(self, lo: int, hi: int) -> bytes:
        return bytes(self._buf[lo * UNIT_BYTES:hi * UNIT_BYTES])

    def __len__(self) -> int:
        return len(self._buf) // UNIT_BYTES

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConsumeQueue) and self._buf == other._buf

    def packed(self) -> bytes:
        """The units as stored (for checkpoints)."""
        return bytes(self._buf)


class QueueStore(Protocol):
    """Makes the state machine's queues and records them in its checkpoints."""

    def create(self, no: int) -> UnitQueue: ...

    def record(self, queue: UnitQueue) -> Any:
        """What a checkpoint keeps of ``queue`` (plain CBOR data)."""
        ...

    def restore(self, no: int, record: Any) -> UnitQueue: ...

    def from_packed(self, no: int, packed: bytes) -> UnitQueue:
        """A queue from a checkpoint of an earlier version, which held the units themselves."""
        ...

    def drop(self, queue: UnitQueue) -> None:
        """``queue``'s topic was deleted."""
        ...

    def flush(self) -> None:
        """Write what is held in memory for writing (before a checkpoint)."""
        ...

    def close(self) -> None: ...


class MemoryQueues:
    """Queues in memory; a checkpoint holds their units."""

    def create(self, no: int) -> UnitQueue:
        return ConsumeQueue(no=no)

    def record(self, queue: UnitQueue) -> Any:
        assert isinstance(queue, ConsumeQueue)
        return queue.packed()

    def restore(self, no: int, record: Any) -> UnitQueue:
        if not isinstance(record, bytes):
            raise ValueError("consume queue must be packed units")
        return ConsumeQueue(record, no)

    def from_packed(self, no: int, packed: bytes) -> UnitQueue:
        return self.restore(no, packed)

    def drop(self, queue: UnitQueue) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
