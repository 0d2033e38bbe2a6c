"""The commitlog's state in memory, its file handling and its reads: the base that the other
parts of ``FileLogStore`` (writes, recovery, test faults; ``dledger.storage.commitlog``) build on.

Owns the in-memory view of one log directory (the segment list, and two ``array('q')`` holding
the position and term of every entry held, so ``term_at`` and ``position_of`` cost one lookup),
opening and deleting segment files, every fsync (a failed one marks the store failed), and
reads (one ``pread`` per segment touched, every entry verified). It must not write entries:
``commitlog_writes`` does.
"""

from __future__ import annotations

import bisect
import logging
import os
from array import array
from collections.abc import Callable, Sequence

from dledger.raft.types import Entry
from dledger.storage.entry_codec import (
    DATA_SUFFIX,
    HEADER_BYTES,
    INDEX_SUFFIX,
    FrameError,
    decode_entry,
    segment_file_name,
)
from dledger.storage.hardstate import storage_error
from dledger.storage.seams import slice_positions
from dledger.storage.segment import Segment, cut_zero_tail, open_fd, pread_exact, write_index
from protocol.errors import CompactedError, CorruptLogError, StorageError

__all__ = ["LogReads"]

log = logging.getLogger("dledger.storage.commitlog")

_ENTRY_OVERHEAD_BYTES = 24  # what Entry.size_bytes adds to the body: max_bytes counts that size


class LogReads:
    """A log directory's state, files and reads (``FileLogStore`` is the whole store)."""

    def __init__(self, dir_path: str, segment_bytes_max: int, dir_fd: int,
                 verify_checksums: bool = True) -> None:
        self._dir = dir_path
        self._verify = verify_checksums  # False only for the skip-checksum canary
        self._segment_bytes_max = segment_bytes_max
        self._dir_fd = dir_fd
        self._segments: list[Segment] = []
        self._base_index = 0  # the last entry retained away (0: none)
        self._base_term = 0
        self._base_position = 0  # position of the first entry held
        self._positions = array("q")  # [k]: position of entry base_index + 1 + k
        self._terms = array("q")
        self._end_position = 0
        self._dirty: set[Segment] = set()
        self._dir_dirty = False
        self._dir_generation = 0  # bumped whenever the directory becomes dirty
        self._closed = False
        self._failed: str | None = None

    # -- reads ----------------------------------------------------------------------------------

    def first_index(self) -> int:
        return self._base_index + 1

    def last_index(self) -> int:
        return self._base_index + len(self._terms)

    def end_position(self) -> int:
        """Position just past the last entry held: where the next entry will be written."""
        return self._end_position

    def term_at(self, index: int) -> int:
        k = index - self._base_index - 1
        if 0 <= k < len(self._terms):
            return self._terms[k]
        if k == -1:
            return self._base_term
        if k < -1:
            raise CompactedError(f"index {index} retained away (first index {self.first_index()})")
        raise IndexError(f"index {index} past last index {self.last_index()}")

    def position_of(self, index: int) -> int:
        k = index - self._base_index - 1
        if not 0 <= k < len(self._positions):
            raise IndexError(f"index {index} not held ({self.first_index()}..{self.last_index()})")
        return self._positions[k]

    def positions_of(self, lo: int, hi: int) -> Sequence[int]:
        """``position_of`` for every index in lo..hi (one slice, for a batch being applied)."""
        return slice_positions(self._positions, self._base_index, lo, hi)

    def entries(self, lo: int, hi: int, max_bytes: int) -> Sequence[Entry]:
        """Entries [lo, hi), at least one if lo < hi, stopping before max_bytes (counted as
        ``Entry.size_bytes``) would be exceeded. Every entry read is verified."""
        if lo <= self._base_index:
            raise CompactedError(f"index {lo} retained away (first index {self.first_index()})")
        k_lo = lo - self._base_index - 1
        k_hi = min(hi, self.last_index() + 1) - self._base_index - 1
        total_bytes = 0
        for k in range(k_lo, k_hi):
            total_bytes += self._entry_bytes(k) - HEADER_BYTES + _ENTRY_OVERHEAD_BYTES
            if k > k_lo and total_bytes > max_bytes:
                k_hi = k
                break
        return self._read_span(k_lo, k_hi)

    def read_at(self, position: int) -> Entry:
        """The entry starting at commitlog ``position`` (verified)."""
        if position < self._base_position:
            start = self._base_position
            raise CompactedError(f"position {position} retained away (log starts at {start})")
        k = bisect.bisect_left(self._positions, position)
        if k == len(self._positions) or self._positions[k] != position:
            raise IndexError(f"no entry starts at position {position}")
        return self._read_span(k, k + 1)[0]

    def _entry_bytes(self, k: int) -> int:
        following = self._positions[k + 1] if k + 1 < len(self._positions) else self._end_position
        return following - self._positions[k]

    def _segment_of(self, index: int) -> int:
        return bisect.bisect_right(self._segments, index, key=lambda seg: seg.first_index) - 1

    def _read_span(self, k_lo: int, k_hi: int) -> list[Entry]:
        self._check_usable()
        out: list[Entry] = []
        k = k_lo
        while k < k_hi:
            seg = self._segments[self._segment_of(self._base_index + 1 + k)]
            k_end = min(k_hi, seg.first_index + seg.entry_count - self._base_index - 1)
            start = self._positions[k]
            end = self._positions[k_end - 1] + self._entry_bytes(k_end - 1)
            offset = start - seg.base_position
            try:
                buf = pread_exact(seg.data_fd, end - start, offset)
                for j in range(k, k_end):
                    offset = self._positions[j] - seg.base_position
                    index, size = self._base_index + 1 + j, self._entry_bytes(j)
                    out.append(decode_entry(buf, self._positions[j] - start, start, index, size,
                                            self._verify))
            except FrameError as err:
                raise CorruptLogError(f"{seg.data_path}: offset {offset}: {err}") from err
            except OSError as err:
                raise storage_error(err, f"reading {seg.data_path}") from err
            k = k_end
        return out

    def _check_usable(self) -> None:
        if self._closed:
            raise StorageError(f"{self._dir}: log store is closed")
        if self._failed is not None:
            raise StorageError(f"{self._dir}: log store failed ({self._failed}); reopen it")

    def close(self) -> None:
        """Release the files, the last data file cut back to its entries. Does not sync:
        unsynced bytes stay in the page cache only."""
        self._release(tidy=True)

    def _release(self, tidy: bool) -> None:
        if self._closed:
            return
        self._closed = True
        for seg in self._segments:
            if tidy and self._failed is None:
                try:  # both derived or spare: the next open rebuilds the index, cuts the zeros
                    write_index(seg)
                    cut_zero_tail(seg)
                except OSError as err:
                    log.warning("%s: not tidied on close: %s", seg.data_path, err)
            os.close(seg.data_fd)
            os.close(seg.index_fd)
        os.close(self._dir_fd)  # releases the directory lock

    # -- files ----------------------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self._dir, name)

    def _open_segment_files(
        self, base_position: int, first_index: int, exclusive: bool
    ) -> Segment:
        data_path = self._path(segment_file_name(base_position, DATA_SUFFIX))
        index_path = self._path(segment_file_name(base_position, INDEX_SUFFIX))
        data_fd = open_fd(data_path, exclusive)
        try:
            index_fd = open_fd(index_path, exclusive)
        except OSError:
            os.close(data_fd)
            if exclusive:
                os.unlink(data_path)
            raise
        return Segment(base_position, first_index, data_path, index_path, data_fd, index_fd)

    def _delete_segment(self, seg: Segment) -> None:
        os.close(seg.data_fd)
        os.close(seg.index_fd)
        os.unlink(seg.data_path)
        os.unlink(seg.index_path)
        self._dirty.discard(seg)
        self._dir_dirty = True
        self._dir_generation += 1

    def _fsync(self, *fds: int, datasync: Callable[[int], None] | None = None) -> None:
        try:
            for fd in fds:
                if fd == self._dir_fd:
                    os.fsync(fd)
                else:  # flushes the file size too: it is needed to read the data
                    (datasync or os.fdatasync)(fd)
        except OSError as err:
            self.fsync_failed(err)
            raise

    def fsync_failed(self, err: OSError) -> StorageError:
        """An fsync of a token failed (on a thread or in the kernel's AIO): from now on the
        store refuses work, as after a failed fsync of its own (the kernel may have dropped the
        pages). Returns the error for the caller to raise."""
        self._failed = f"fsync failed: {err}"
        return storage_error(err, f"syncing {self._dir}")
