"""One key-index file (RocketMQ's IndexFile, re-thought for crash safety): fixed hash slots plus
fixed-size entries linked per slot, in one preallocated file named by the first log index it
covers.

Layout (little-endian): two superblocks (at 0 and 512), two slot tables (at 4096, one per
superblock), then the entries. A superblock says which log indexes the file covers (first,
applied), how many entries it holds, their time range, and CRC32s of its slot table, of the
entries it counts and of itself; its generation orders the two. An entry is (key hash, slot in
its log entry, commitlog position, store time, previous entry of the same hash slot): entry
numbers start at 1, 0 ends a chain.

The entries are append-only: written (one ``pwrite`` per applied batch) but never rewritten,
whatever the file's state. The active file's slot table lives in memory (4 bytes per slot, a
fixed size, never per key); a checkpoint writes it into the table of the older superblock, then
that superblock, and fsyncs once. On open, the newer superblock whose checksums all hold wins;
a torn or lost write leaves the older one, which named only entries and a table written before
(so the file is never trusted beyond what was durable). A file with no valid superblock is
damaged (``IndexFileError``): the caller rebuilds it from the log. A sealed (full) file is
read from its mapping only; the active one keeps its table in memory. Owns no policy (rotation,
retention, what is indexed): ``broker.features.query.index`` does.
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
import zlib
from collections.abc import Callable, Iterator
from typing import Any

from protocol.broker_errors import BrokerError

assert sys.byteorder == "little", "the slot table is kept as native 32-bit words"

MAGIC = b"DLKX"
FORMAT_VERSION = 1
SUPER = struct.Struct("<4sHHIIQQQIIQQI")  # ..., slots_crc; then the superblock's own CRC32
SUPER_AT = (0, 512)
TABLES_AT = 4096
ENTRY = struct.Struct("<IIQQI")  # key hash, slot, position, store time (ms), previous entry
ENTRY_BYTES = ENTRY.size
TS_NONE = 2**64 - 1


class IndexFileError(BrokerError):
    """An index file is damaged or not one of ours (it is rebuilt from the log, never trusted)."""

    code = "INDEX_DAMAGED"


def file_bytes(slots: int, capacity: int) -> int:
    return _entries_at(slots) + capacity * ENTRY_BYTES


def _entries_at(slots: int) -> int:
    return TABLES_AT + -(-(2 * 4 * slots) // 4096) * 4096


class IndexFile:
    """Create with ``create`` or ``open``; ``add`` on the apply path, ``write_pending`` at the end
    of each applied batch, ``checkpoint`` (a job for a thread) before the broker's checkpoint."""

    def __init__(self, path: str, fd: int, slots: int, capacity: int, first_index: int) -> None:
        self.path, self.fd = path, fd
        self.slots, self.capacity, self.first_index = slots, capacity, first_index
        self.applied_index = first_index - 1
        self.count = 0
        self.begin_ts_ms, self.end_ts_ms = TS_NONE, 0
        self.sealed = False
        self.generation = 0
        self._entries_crc = 0
        # the active file's slot heads, in an anonymous mapping: a page becomes resident when a
        # head on it is first written (a zeroed bytearray is resident at once: 4 MiB at start)
        self._table: mmap.mmap | None = mmap.mmap(-1, 4 * slots)
        self._heads = memoryview(self._table).cast("I")
        self._pending = bytearray()
        self._pending_from = 0  # the entry number (0-based) of the first pending entry
        self._entries_at = _entries_at(slots)
        self._map = mmap.mmap(fd, file_bytes(slots, capacity), access=mmap.ACCESS_READ)

    # -- open and create --------------------------------------------------------------------

    @classmethod
    def create(cls, path: str, first_index: int, slots: int, capacity: int) -> IndexFile:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, file_bytes(slots, capacity))  # sparse: disk fills as entries come
            return cls(path, fd, slots, capacity, first_index)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def open(cls, path: str) -> IndexFile:
        """The file as its newest valid superblock describes it; IndexFileError if none is."""
        fd = os.open(path, os.O_RDWR)
        try:
            return cls._open(path, fd)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def _open(cls, path: str, fd: int) -> IndexFile:
        size = os.fstat(fd).st_size
        candidates = [(k, fields) for k, at in enumerate(SUPER_AT)
                      if (fields := _superblock(os.pread(fd, SUPER.size + 4, at))) is not None]
        candidates.sort(key=lambda c: -c[1][7])  # the newer first; if it fails, the older one
        reasons = []
        for k, fields in candidates:
            (_, _, sealed, slots, capacity, first, applied, gen, count, entries_crc,
             begin_ts, end_ts, slots_crc) = fields
            if size != file_bytes(slots, capacity) or count > capacity:
                reasons.append(f"generation {gen}: size {size} does not fit its geometry")
                continue
            table = bytearray(os.pread(fd, 4 * slots, TABLES_AT + k * 4 * slots))
            entries = os.pread(fd, count * ENTRY_BYTES, _entries_at(slots))
            if zlib.crc32(table) != slots_crc or len(entries) != count * ENTRY_BYTES \
                    or zlib.crc32(entries) != entries_crc:
                reasons.append(f"generation {gen}: slot table or entries fail their checksum")
                continue
            f = cls(path, fd, slots, capacity, first)
            f.applied_index, f.count, f.generation = applied, count, gen
            f.begin_ts_ms, f.end_ts_ms, f._entries_crc = begin_ts, end_ts, entries_crc
            f._table[:] = table  # type: ignore[index]
            f._pending_from = count
            if sealed:
                f._seal_in_memory(k)
            return f
        raise IndexFileError(f"{path}: no valid superblock ({'; '.join(reasons) or 'none'})")

    # -- writes (the apply path) ------------------------------------------------------------------

    def room(self) -> int:
        return self.capacity - self.count

    def add(self, hashes: list[int], position: int, store_ts_ms: int) -> None:
        """Append one log entry's keys: ``[key hash, slot, key hash, slot...]``. The caller
        checked ``room``."""
        assert not self.sealed and len(hashes) <= 2 * self.room()
        heads, slots, pending, n, pack = self._heads, self.slots, self._pending, self.count, ENTRY.pack
        for k in range(0, len(hashes), 2):
            h = hashes[k]
            s = h % slots
            n += 1
            pending += pack(h, hashes[k + 1], position, store_ts_ms, heads[s])
            heads[s] = n
        self.count = n
        if store_ts_ms < self.begin_ts_ms:
            self.begin_ts_ms = store_ts_ms
        if store_ts_ms > self.end_ts_ms:
            self.end_ts_ms = store_ts_ms

    def write_pending(self) -> None:
        """Write the entries added since the last call (one write per applied batch)."""
        if not self._pending:
            return
        data = bytes(self._pending)
        _pwrite_all(self.fd, data, self._entries_at + self._pending_from * ENTRY_BYTES)
        self._entries_crc = zlib.crc32(data, self._entries_crc)
        self._pending_from = self.count
        self._pending.clear()

    def checkpoint(self, seal: bool = False) -> Callable[[], None]:
        """Capture the file's state now (on the apply path's loop) and return the job that makes
        it durable (run it in a thread: two writes and one fsync). ``seal``: the file is full;
        its table moves to the mapping and it takes no more entries."""
        self.write_pending()
        assert self._table is not None
        self.generation += 1
        k = self.generation % 2
        table = bytes(self._table)
        fields = (MAGIC, FORMAT_VERSION, int(seal), self.slots, self.capacity, self.first_index,
                  self.applied_index, self.generation, self.count, self._entries_crc,
                  self.begin_ts_ms, self.end_ts_ms)
        fd = self.fd

        def write() -> None:
            head = SUPER.pack(*fields, zlib.crc32(table))
            _pwrite_all(fd, table, TABLES_AT + k * len(table))
            _pwrite_all(fd, head + zlib.crc32(head).to_bytes(4, "little"), SUPER_AT[k])

        def job() -> None:
            write()
            os.fsync(fd)
        if seal:  # written now, made durable by the next checkpoint's fsync; read from the map
            write()
            self._seal_in_memory(k)
            return lambda: os.fsync(fd)
        return job

    def _seal_in_memory(self, k: int) -> None:
        self.sealed = True
        self._table = None
        self._heads = memoryview(self._map)[TABLES_AT + k * 4 * self.slots:
                                            TABLES_AT + (k + 1) * 4 * self.slots].cast("I")

    # -- reads --------------------------------------------------------------------------------

    def chain(self, key_hash: int, begin_ms: int, end_ms: int,
              visits_max: int) -> Iterator[tuple[int, int, int]]:
        """(position, slot, store time) of the entries with this hash stored in
        [begin_ms, end_ms], newest first, visiting at most ``visits_max`` entries."""
        if self.count == 0 or self.end_ts_ms < begin_ms or self.begin_ts_ms > end_ms:
            return
        self.write_pending()
        n = self._heads[key_hash % self.slots]
        m, base = self._map, self._entries_at - ENTRY_BYTES
        while n and visits_max > 0 and n <= self.count:
            h, slot, position, ts, prev = ENTRY.unpack_from(m, base + n * ENTRY_BYTES)
            if h == key_hash and begin_ms <= ts <= end_ms:
                yield position, slot, ts
            if prev >= n:
                return  # a damaged link: links only point back
            n, visits_max = prev, visits_max - 1

    def close(self) -> None:
        self.write_pending()
        self._heads.release()
        self._map.close()
        os.close(self.fd)


def _superblock(raw: bytes) -> tuple[Any, ...] | None:
    if len(raw) != SUPER.size + 4 or zlib.crc32(raw[:-4]) != int.from_bytes(raw[-4:], "little"):
        return None
    fields = SUPER.unpack(raw[:-4])
    if fields[0] != MAGIC or fields[1] != FORMAT_VERSION or fields[3] < 1:
        return None
    return fields


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
