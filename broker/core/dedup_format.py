"""The dedup table's layout (``broker.core.dedup``): its sizes, masks and spans, and the byte
ranges its checkpoint is read from in place. Shared by the table and its restore
(``broker.core.dedup_restore``)."""

from __future__ import annotations

from array import array
from typing import Any, TypeAlias

assert array("I", [1]).tobytes()[0] == 1, "the runs are checkpointed as little-endian words"

FP_BYTES = 10
ROW_BYTES = FP_BYTES
RUN_BYTES = 16  # a run's first row (4 bytes), queue and offset (8), store time (4)
OFFSET_BITS = 40
OFFSET_MASK = (1 << OFFSET_BITS) - 1
QUEUE_REFS_MAX = 1 << (64 - OFFSET_BITS)
TS_SPAN = 1 << 32  # store times within a table's epoch + this
SEQ_MASK = (1 << 31) - 1  # row numbers are kept modulo 2**31 (+1: 0 is an empty slot)
RUN_MASK = (1 << 32) - 1  # a run's first row number is kept modulo 2**32
SLOTS_MIN = 1024
COMPACT_MIN = 4096  # forgotten rows are dropped from the front in chunks at least this large


Range: TypeAlias = "tuple[bytearray | array[Any], int, int]"  # a buffer's bytes start .. end


Chunk: TypeAlias = "bytes | bytearray | array[Any]"  # bytes, or a buffer of them


def copy_range(r: Range) -> bytearray | array[Any]:
    """The bytes of a range, copied by one slice into a buffer of its own (a checkpoint
    writer's thread copies while the loop appends to the buffer: no view of it may be held
    across, or the append fails)."""
    buffer, start, end = r
    if isinstance(buffer, bytearray):
        return buffer[start:end]
    return buffer[start // buffer.itemsize:end // buffer.itemsize]
