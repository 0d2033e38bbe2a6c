"""The file-backed Raft log: a segmented, append-only, checksummed commitlog (``FileLogStore``).

Owns one node's log directory: its data and index files, their recovery after a crash, group
commit (``sync``), suffix truncation and whole-segment retention. It must not interpret entry
bodies (the broker does) nor decide when to sync (the runtime does); byte layouts live in
``entry_codec``.

A log directory holds:
- ``<position:020d>.data``: entries back to back, the file named by the logical position of its
  first entry. An entry's position is that name plus its offset in the file (no padding), so it
  depends only on the entries before it and is the same on every replica holding them.
  The last segment's file runs ahead of its entries: it is filled with zeros a step
  (``ZERO_FILL_STEP_BYTES``) at a time, and entries are written into it in place. So the
  fdatasync of a group commit writes data pages only, and need not commit a new file size
  through the filesystem's journal, which all replicas on one disk share: in a live group on
  ext4 that made each replica's flush about 80-100 us faster (README, benchmark). A sealed
  segment is cut back to its entries.
- ``<position:020d>.index``: one fixed-width record per entry of the data file of the same name.
  Derived data: rebuilt from the data file when short, cut back when long. So the last
  segment's records are written at its next sync, seal, truncation or close rather than with
  every append: one write less on the replication path.
- ``meta``: index, term and position of the last entry retained away (replaced atomically).

Rules that keep recovery simple and safe:
- Only the last segment may hold bytes that were never fsynced: before a new segment is created,
  the current one is sealed (cut to its entries; data, index and directory fsynced). So on open
  only the last segment's tail can be torn; damage anywhere else is ``CorruptLogError``, never
  skipped.
- In that tail, bytes written since the last fsync may reach the disk in any order (a sector
  at a time, each whole or not at all), so a torn tail can hold intact entries after a hole.
  On open the log ends at the first bad entry, and that is a torn write only if it shows a
  crash's marks (the file ends within it, or one of its sectors is all zeros: what was there
  before the write) and no intact entry after it claims it durable (every frame records how
  far this replica's log was durable when it was written, see ``entry_codec``). Anything else
  (flipped bits, garbage, a durable sector read back as zeros) is ``CorruptLogError``. Zeroed
  sectors within the last fsync window or two are the one damage that cannot be told from a
  torn write. This assumes a filesystem that shows zeros, never stale blocks, where a crash
  interrupted a file's growth (ext4 in its default ``data=ordered`` mode, XFS).
- Every cut (truncation, seal, a failed append, recovery) is an ftruncate, so bytes dropped never
  come back as stale entries in the zero-filled tail, which is written afresh.
- Data before index, and truncation is durable at once: later segments are deleted (last to
  first), then the holding segment is cut, each step fsynced, so a crash leaves a log prefix.
- Retention writes ``meta`` before deleting segments; open deletes segments before it.
- ``open`` fsyncs what it recovered: after a restart, everything the log shows is durable.
- A failed fsync is not retried (the kernel may have marked the unwritten pages clean, so a
  retry could "succeed" without the data): the store refuses further work (``StorageError``)
  and the node must restart, treating it like a crash.
- The directory is locked (``flock``) while a store has it open.

In memory the store keeps two ``array('q')`` (position and term of every entry held), so
``term_at`` and ``position_of`` cost one lookup and reads cost one ``pread`` per segment touched.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import fcntl
import logging
import os
import random
from array import array
from dataclasses import dataclass, field
from typing import Callable, Sequence

from dledger.entry_codec import (
    DATA_SUFFIX,
    HEADER_BYTES,
    INDEX_RECORD_BYTES,
    INDEX_SUFFIX,
    Chunk,
    FrameError,
    Records,
    common_record_count,
    decode_entry,
    decode_meta,
    durable_claim_after,
    encode_index_records,
    encode_meta,
    parse_index,
    parse_segment_file_name,
    plan_chunks,
    scan_entries,
    segment_file_name,
    shows_crash_marks,
)
from dledger.errors import CompactedError, CorruptLogError, StorageError
from dledger.hardstate import (
    TEMP_SUFFIX,
    make_dirs_durably,
    storage_error,
    write_file_atomically,
)
from dledger.log_store import slice_positions
from dledger.raft.types import Entry

__all__ = ["FileLogStore", "DEFAULT_SEGMENT_BYTES_MAX"]

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES_MAX = 64 * 1024 * 1024
ZERO_FILL_STEP_BYTES = 1024 * 1024  # how far the last data file runs ahead of its entries
_ZEROS = memoryview(bytes(ZERO_FILL_STEP_BYTES))
_SECTOR_BYTES = 512  # a disk keeps each sector written since the last fsync whole or not at all
_META_NAME = "meta"
_ENTRY_OVERHEAD_BYTES = 24  # what Entry.size_bytes adds to the body: max_bytes counts that size


@dataclass(eq=False)
class _Segment:
    """One data file and its index file. Sizes are what this process wrote (index = count * 24)."""

    base_position: int
    first_index: int
    data_path: str
    index_path: str
    data_fd: int
    index_fd: int
    data_bytes: int = 0
    entry_count: int = 0
    file_bytes: int = 0  # size of the data file: data_bytes plus the zero-filled tail
    synced_data_bytes: int = 0  # sizes at the last sync() (cut down by truncation)
    synced_entry_count: int = 0
    durable_data_bytes: int = 0  # sizes at the last fsync of any kind (sync, seal, truncation)
    durable_entry_count: int = 0
    created_since_sync: bool = True
    # Index records of the last entries, not yet written to the index file (see the module
    # docstring): the file holds entry_count - len(pending_index) records.
    pending_index: list[bytes] = field(default_factory=list)

    @property
    def index_records_in_file(self) -> int:
        return self.entry_count - len(self.pending_index)

    def mark_durable(self) -> None:
        self.durable_data_bytes, self.durable_entry_count = self.data_bytes, self.entry_count

    def mark_synced(self) -> None:
        self.mark_durable()
        self.synced_data_bytes, self.synced_entry_count = self.data_bytes, self.entry_count
        self.created_since_sync = False


@dataclass(frozen=True, eq=False)
class SyncToken:
    """What one background group commit covers: taken on the loop thread by ``sync_begin``,
    fsynced elsewhere (``fsync_fds`` on a thread, or the kernel's AIO), recorded back by
    ``sync_end``."""

    fds: tuple[int, ...]
    dir_fd: int | None
    dir_generation: int
    sizes: tuple[tuple[_Segment, int, int], ...]  # segment, data bytes, entry count at begin


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write ``data`` at ``offset``: one os.pwrite unless the kernel writes short."""
    written = os.pwrite(fd, data, offset)
    if written == len(data):
        return
    view = memoryview(data)[written:]
    while view:
        done = os.pwrite(fd, view, offset + written)
        if done == 0:  # not seen on a regular file; never loop on it
            raise OSError(errno.EIO, f"pwrite wrote nothing at offset {offset + written}")
        view, written = view[done:], written + done


def _write_index(seg: _Segment) -> None:
    """Write the segment's pending index records (after their data: data before index). On an
    error they stay pending and the file is cut back to whole records (a short write first, as
    a full disk often does, would misalign the rest)."""
    if not seg.pending_index:
        return
    in_file = seg.index_records_in_file
    try:
        _pwrite_all(seg.index_fd, b"".join(seg.pending_index), in_file * INDEX_RECORD_BYTES)
    except OSError:
        # If even the cut fails, open() still copes: the records' checksums stop at the first
        # bad one and the rest is rebuilt from the data.
        with contextlib.suppress(OSError):
            os.ftruncate(seg.index_fd, in_file * INDEX_RECORD_BYTES)
        raise
    seg.pending_index.clear()


def _cut_zero_tail(seg: _Segment) -> None:
    """Cut the data file back to its entries (not fsynced: the caller does, if it must)."""
    if seg.file_bytes > seg.data_bytes:
        os.ftruncate(seg.data_fd, seg.data_bytes)
        seg.file_bytes = seg.data_bytes


def _pread_exact(fd: int, size: int, offset: int) -> bytes:
    parts, done = [], 0
    while done < size:
        part = os.pread(fd, size - done, offset + done)
        if not part:
            raise FrameError(f"file ends before offset {offset + size}")
        parts.append(part)
        done += len(part)
    return b"".join(parts)


def _bases_named(names: list[str], suffix: str) -> list[int]:
    bases = (parse_segment_file_name(name, suffix) for name in names)
    return [base for base in bases if base is not None]


def _open_fd(path: str, exclusive: bool) -> int:
    """Data and index files are written at known offsets (pwrite), never appended to."""
    flags = os.O_RDWR | os.O_CREAT | (os.O_EXCL if exclusive else 0)
    return os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)


class FileLogStore:
    """A ``LogStore`` in a directory of segment files. Create with ``FileLogStore.open``."""

    def __init__(self, dir_path: str, segment_bytes_max: int, dir_fd: int,
                 verify_checksums: bool = True) -> None:
        self._dir = dir_path
        self._verify = verify_checksums  # False only for the skip-checksum canary
        self._segment_bytes_max = segment_bytes_max
        self._dir_fd = dir_fd
        self._segments: list[_Segment] = []
        self._base_index = 0  # the last entry retained away (0: none)
        self._base_term = 0
        self._base_position = 0  # position of the first entry held
        self._positions = array("q")  # [k]: position of entry base_index + 1 + k
        self._terms = array("q")
        self._end_position = 0
        self._dirty: set[_Segment] = set()
        self._dir_dirty = False
        self._dir_generation = 0  # bumped whenever the directory becomes dirty
        self._closed = False
        self._failed: str | None = None

    @classmethod
    def open(
        cls,
        dir_path: str | os.PathLike[str],
        segment_bytes_max: int = DEFAULT_SEGMENT_BYTES_MAX,
        verify_all: bool = False,
        verify_checksums: bool = True,
    ) -> FileLogStore:
        """Open (creating if missing) and recover the log in ``dir_path``.

        Verifies the last segment entry by entry (every segment with ``verify_all``), cuts a
        torn tail, rebuilds or cuts back index files, and makes the result durable.
        """
        if segment_bytes_max < HEADER_BYTES:
            raise ValueError(f"segment_bytes_max {segment_bytes_max} is below {HEADER_BYTES}")
        path = os.path.abspath(os.fspath(dir_path))
        try:
            make_dirs_durably(path)
            dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as err:
            raise storage_error(err, f"opening log directory {path}") from err
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(dir_fd)
            raise StorageError(f"{path}: log directory is in use by another open store") from err
        store = cls(path, segment_bytes_max, dir_fd, verify_checksums)
        try:
            store._recover(verify_all)
        except OSError as err:
            store.close()
            raise storage_error(err, f"recovering {path}") from err
        except FrameError as err:  # a file shrank while being read: not ours alone
            store.close()
            raise CorruptLogError(f"{path}: {err}") from err
        except BaseException:
            store.close()
            raise
        return store

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
                buf = _pread_exact(seg.data_fd, end - start, offset)
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

    # -- writes -------------------------------------------------------------------------------

    def append(self, entries: Sequence[Entry]) -> None:
        """Write ``entries`` (one pwrite per file touched), truncating a conflicting suffix first.

        On ENOSPC raises ``DiskFullError`` with the files cut back and the log as before the
        write (a truncation asked for by this call stays done).
        """
        if not entries:
            return
        self._check_usable()
        first = entries[0].index
        if not self.first_index() <= first <= self.last_index() + 1:
            raise StorageError(
                f"append at index {first} outside {self.first_index()}..{self.last_index() + 1}"
            )
        if first <= self.last_index():
            self._truncate_from(first)
        last = self._segments[-1] if self._segments else None
        fill_bytes = last.data_bytes if last else None
        durable_position = last.base_position + last.durable_data_bytes if last else 0
        chunks = plan_chunks(entries, self._end_position, fill_bytes, self._segment_bytes_max,
                             durable_position)
        self._write_chunks(chunks)

    def _write_chunks(self, chunks: list[Chunk]) -> None:
        snapshot = self._snapshot()
        try:
            for chunk in chunks:
                seg = self._segment_for(chunk)
                chunk_bytes = chunk.records.end_position(0) - chunk.records.positions[0]
                if seg.data_bytes + chunk_bytes > seg.file_bytes:
                    self._zero_fill(seg, seg.data_bytes + chunk_bytes)
                _pwrite_all(seg.data_fd, b"".join(chunk.data), seg.data_bytes)  # data first
                seg.file_bytes = max(seg.file_bytes, seg.data_bytes + chunk_bytes)
                seg.pending_index.extend(chunk.index)
                seg.data_bytes += chunk_bytes
                seg.entry_count += len(chunk.records)
                self._positions.extend(chunk.records.positions)
                self._terms.extend(chunk.records.terms)
                self._end_position += chunk_bytes
                self._dirty.add(seg)
        except OSError as err:
            self._roll_back(snapshot)
            raise storage_error(err, f"appending to {self._dir}") from err

    def _segment_for(self, chunk: Chunk) -> _Segment:
        if not chunk.new_segment:
            return self._segments[-1]
        if self._segments:
            self._seal(self._segments[-1])
        seg = self._open_segment_files(chunk.base_position, self.last_index() + 1, exclusive=True)
        self._segments.append(seg)
        self._dir_dirty = True
        self._dir_generation += 1
        return seg

    def _zero_fill(self, seg: _Segment, end_bytes: int) -> None:
        """Extend the data file with zeros to hold ``end_bytes`` and a step more (within the
        segment size): its size then changes once per step, not with every append. The next
        sync makes the zeros durable. A disk too full for them gets none (see below)."""
        target = max(end_bytes, min(end_bytes + ZERO_FILL_STEP_BYTES, self._segment_bytes_max))
        offset = seg.file_bytes
        try:
            while offset < target:
                piece = _ZEROS[: min(target - offset, len(_ZEROS))]
                _pwrite_all(seg.data_fd, piece, offset)
                offset += len(piece)
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
            # A nearly full disk: no room to run ahead. Drop the zeros; the entries' own write
            # extends the file, as an append would (and fails as one would if even that is short).
            os.ftruncate(seg.data_fd, seg.file_bytes)
            return
        seg.file_bytes = target

    def _seal(self, seg: _Segment) -> None:
        """Make a segment wholly durable before a later one gets bytes (see module docstring)."""
        _cut_zero_tail(seg)
        _write_index(seg)
        self._fsync(seg.data_fd, seg.index_fd, self._dir_fd)
        seg.mark_durable()

    def _snapshot(self) -> tuple[int, int, int, int]:
        last = self._segments[-1] if self._segments else None
        return (
            len(self._segments),
            last.data_bytes if last else 0,
            last.entry_count if last else 0,
            len(self._terms),
        )

    def _roll_back(self, snapshot: tuple[int, int, int, int]) -> None:
        """Undo a partly written append: remove new segments, cut the old last one back."""
        segment_count, data_bytes, entry_count, term_count = snapshot
        try:
            for seg in reversed(self._segments[segment_count:]):
                self._delete_segment(seg)
            del self._segments[segment_count:]
            if self._segments:
                self._cut_segment(self._segments[-1], data_bytes, entry_count)
            self._fsync(self._dir_fd)
        except OSError as err:
            self._failed = f"rolling back a failed append: {err}"
            raise storage_error(err, f"rolling back an append to {self._dir}") from err
        del self._positions[term_count:]
        del self._terms[term_count:]
        last = self._segments[-1] if self._segments else None
        self._end_position = last.base_position + data_bytes if last else self._base_position

    def _truncate_from(self, index: int) -> None:
        """Durably drop entries ``index`` and later: whole later segments first, then cut."""
        k = index - self._base_index - 1
        new_end_position = self._positions[k]
        holder = self._segment_of(index)
        keep = holder if self._segments[holder].first_index == index else holder + 1
        try:
            for seg in reversed(self._segments[keep:]):
                self._delete_segment(seg)
            if keep < len(self._segments):
                self._fsync(self._dir_fd)
            del self._segments[keep:]
            seg = self._segments[holder] if keep == holder + 1 else None
            if seg is not None:
                data_bytes = new_end_position - seg.base_position
                self._cut_segment(seg, data_bytes, index - seg.first_index)
        except OSError as err:
            self._failed = f"truncating: {err}"
            raise storage_error(err, f"truncating {self._dir} from index {index}") from err
        del self._positions[k:]
        del self._terms[k:]
        self._end_position = new_end_position

    def _cut_segment(self, seg: _Segment, data_bytes: int, entry_count: int) -> None:
        """Cut both files back and fsync them (data first): a cut is never undone by a crash."""
        os.ftruncate(seg.data_fd, data_bytes)
        seg.file_bytes = data_bytes
        self._fsync(seg.data_fd)
        in_file = seg.index_records_in_file
        if entry_count < in_file:
            seg.pending_index.clear()
        else:  # the cut falls among the records not yet written: they stay pending
            del seg.pending_index[entry_count - in_file :]
        os.ftruncate(seg.index_fd, min(entry_count, in_file) * INDEX_RECORD_BYTES)
        self._fsync(seg.index_fd)
        seg.data_bytes, seg.entry_count = data_bytes, entry_count
        seg.synced_data_bytes = min(seg.synced_data_bytes, data_bytes)
        seg.synced_entry_count = min(seg.synced_entry_count, entry_count)
        seg.mark_durable()

    def sync(self, datasync: Callable[[int], None] | None = None) -> None:
        """Group commit: fsync every file written since the last sync (and the directory).
        ``datasync`` replaces os.fdatasync for the data files (``dledger.aiofsync``)."""
        self._check_usable()
        try:
            for seg in self._dirty:
                # Only the data is fsynced on the hot path: the index of the last segment is
                # derived data that open() verifies and rebuilds from the data (sealing a
                # segment fsyncs its index too).
                _write_index(seg)
                self._fsync(seg.data_fd, datasync=datasync)
            if self._dir_dirty:
                self._fsync(self._dir_fd)
        except OSError as err:
            raise storage_error(err, f"syncing {self._dir}") from err
        for seg in self._segments:
            seg.mark_synced()
        self._dirty.clear()
        self._dir_dirty = False

    # -- background group commit (the runtime's leader path) ------------------------------------
    # The caller guarantees that nothing but plain appends happens between sync_begin and
    # sync_end (no truncation, retention or close: they would close fds being fsynced).

    def sync_begin(self) -> SyncToken:
        self._check_usable()
        dirty = tuple(self._dirty)
        try:
            for seg in dirty:
                _write_index(seg)
        except OSError as err:
            raise storage_error(err, f"writing the index of {self._dir}") from err
        return SyncToken(tuple(seg.data_fd for seg in dirty),
                         self._dir_fd if self._dir_dirty else None, self._dir_generation,
                         tuple((seg, seg.data_bytes, seg.entry_count) for seg in dirty))

    def fsync_fds(self, token: SyncToken) -> None:
        """The fsyncs of a token (OSError on failure, which also marks the store failed, as
        ``fsync_failed`` does); safe on another thread while the loop thread appends."""
        dir_fds = () if token.dir_fd is None else (token.dir_fd,)
        self._fsync(*token.fds, *dir_fds)  # (a failure is recorded even if no one waits now)

    def fsync_failed(self, err: OSError) -> StorageError:
        """An fsync of a token failed (on a thread or in the kernel's AIO): from now on the
        store refuses work, as after a failed fsync of its own (the kernel may have dropped the
        pages). Returns the error for the caller to raise."""
        self._failed = f"fsync failed: {err}"
        return storage_error(err, f"syncing {self._dir}")

    def sync_end(self, token: SyncToken) -> None:
        for seg, data_bytes, entry_count in token.sizes:
            if seg.data_bytes < data_bytes:
                continue  # cut since (cannot happen under the caller's guarantee)
            seg.durable_data_bytes = max(seg.durable_data_bytes, data_bytes)
            seg.durable_entry_count = max(seg.durable_entry_count, entry_count)
            seg.synced_data_bytes = max(seg.synced_data_bytes, data_bytes)
            seg.synced_entry_count = max(seg.synced_entry_count, entry_count)
            seg.created_since_sync = False
            if seg.data_bytes == data_bytes:
                self._dirty.discard(seg)
        if token.dir_fd is not None and token.dir_generation == self._dir_generation:
            self._dir_dirty = False

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

    def retain_from(self, index: int) -> int:
        """Delete whole segments whose entries are all below ``index`` (never the last segment);
        returns the new first_index()."""
        self._check_usable()
        drop = 0
        while drop + 1 < len(self._segments) and self._segments[drop + 1].first_index <= index:
            drop += 1
        if drop == 0:
            return self.first_index()
        kept = self._segments[drop]
        base_index, base_position = kept.first_index - 1, kept.base_position
        base_term = self.term_at(base_index)
        what = f"retaining {self._dir} from index {index}"
        meta = encode_meta(base_index, base_term, base_position)
        try:  # nothing is deleted yet: whichever meta a crash leaves, open agrees with it
            write_file_atomically(self._path(_META_NAME), meta)
        except OSError as err:
            raise storage_error(err, what) from err
        try:
            for seg in self._segments[:drop]:
                self._delete_segment(seg)
            self._fsync(self._dir_fd)
        except OSError as err:
            self._failed = f"retention: {err}"
            raise storage_error(err, what) from err
        del self._segments[:drop]
        del self._positions[: base_index - self._base_index]
        del self._terms[: base_index - self._base_index]
        self._base_index, self._base_term = base_index, base_term
        self._base_position = base_position
        return self.first_index()

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
                    _write_index(seg)
                    _cut_zero_tail(seg)
                except OSError as err:
                    log.warning("%s: not tidied on close: %s", seg.data_path, err)
            os.close(seg.data_fd)
            os.close(seg.index_fd)
        os.close(self._dir_fd)  # releases the directory lock

    def _check_usable(self) -> None:
        if self._closed:
            raise StorageError(f"{self._dir}: log store is closed")
        if self._failed is not None:
            raise StorageError(f"{self._dir}: log store failed ({self._failed}); reopen it")

    # -- files ----------------------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self._dir, name)

    def _open_segment_files(
        self, base_position: int, first_index: int, exclusive: bool
    ) -> _Segment:
        data_path = self._path(segment_file_name(base_position, DATA_SUFFIX))
        index_path = self._path(segment_file_name(base_position, INDEX_SUFFIX))
        data_fd = _open_fd(data_path, exclusive)
        try:
            index_fd = _open_fd(index_path, exclusive)
        except OSError:
            os.close(data_fd)
            if exclusive:
                os.unlink(data_path)
            raise
        return _Segment(base_position, first_index, data_path, index_path, data_fd, index_fd)

    def _delete_segment(self, seg: _Segment) -> None:
        os.close(seg.data_fd)
        os.close(seg.index_fd)
        os.unlink(seg.data_path)
        os.unlink(seg.index_path)
        self._dirty.discard(seg)
        self._dir_dirty = True
        self._dir_generation += 1

    # -- recovery -----------------------------------------------------------------------------

    def _recover(self, verify_all: bool) -> None:
        names = os.listdir(self._dir)
        for name in names:
            if name.endswith(TEMP_SUFFIX):
                os.unlink(self._path(name))
        self._load_meta()
        data_bases = self._drop_stale_files(names)
        for k, base_position in enumerate(data_bases):
            last = k == len(data_bases) - 1
            self._recover_segment(base_position, verify=(verify_all or last) and self._verify,
                                  last=last)
        if self._segments and self._segments[-1].data_bytes == 0:
            self._delete_segment(self._segments.pop())  # a crash left it empty
        if self._segments:
            self._fsync(self._segments[-1].data_fd, self._segments[-1].index_fd)
        self._fsync(self._dir_fd)
        for seg in self._segments:
            seg.mark_synced()
        self._dir_dirty = False

    def _load_meta(self) -> None:
        path = self._path(_META_NAME)
        try:
            with open(path, "rb") as f:
                buf = f.read()
        except FileNotFoundError:
            return
        try:
            self._base_index, self._base_term, self._base_position = decode_meta(buf)
        except FrameError as err:
            raise CorruptLogError(f"{path}: {err}") from err
        self._end_position = self._base_position

    def _drop_stale_files(self, names: list[str]) -> list[int]:
        """Delete segments retention had not finished deleting and index files without data;
        returns the base positions of the data files left, in order."""
        data_bases = sorted(_bases_named(names, DATA_SUFFIX))
        index_bases = set(_bases_named(names, INDEX_SUFFIX))
        kept = [b for b in data_bases if b >= self._base_position]
        for base in set(data_bases) - set(kept):
            os.unlink(self._path(segment_file_name(base, DATA_SUFFIX)))
        for base in index_bases - set(kept):
            os.unlink(self._path(segment_file_name(base, INDEX_SUFFIX)))
        return kept

    def _recover_segment(self, base_position: int, verify: bool, last: bool) -> None:
        seg = self._open_segment_files(base_position, self.last_index() + 1, exclusive=False)
        self._segments.append(seg)
        if base_position != self._end_position:
            raise CorruptLogError(
                f"{seg.data_path}: segment starts at position {base_position} but the log before"
                f" it ends at {self._end_position} (a segment is missing or was cut)"
            )
        file_bytes = os.fstat(seg.data_fd).st_size
        index_buf = _pread_exact(seg.index_fd, os.fstat(seg.index_fd).st_size, 0)
        records = Records() if verify else parse_index(index_buf, base_position, file_bytes)
        records = self._scan_rest(seg, records, file_bytes, last)
        self._reconcile_index(seg, index_buf, records)
        seg.data_bytes = records.end_position(base_position) - base_position
        seg.entry_count = len(records)
        if file_bytes > seg.data_bytes:  # the zero-filled tail, or a torn one (_recover fsyncs)
            os.ftruncate(seg.data_fd, seg.data_bytes)
        seg.file_bytes = seg.data_bytes
        self._positions.extend(records.positions)
        self._terms.extend(records.terms)
        self._end_position = base_position + seg.data_bytes

    def _scan_rest(self, seg: _Segment, records: Records, file_bytes: int, last: bool) -> Records:
        """Verify the data past what ``records`` covers. In the last segment the entries end at
        the first bad one (the caller cuts the rest) if only zeros follow (the zero-filled
        tail), or if it is a torn write: it shows a crash's marks and no intact entry after it
        says it was durable. Anything else is ``CorruptLogError``."""
        start = records.end_position(seg.base_position) - seg.base_position
        if start == file_bytes:
            return records
        buf = _pread_exact(seg.data_fd, file_bytes - start, start)
        buf_position, buf_index = seg.base_position + start, seg.first_index + len(records)
        scanned, stop, reason = scan_entries(buf, buf_position, buf_index, self._verify)
        records.extend(scanned)
        if reason is None:
            return records
        where = f"{seg.data_path}: offset {start + stop}: {reason}"
        if not last:
            raise CorruptLogError(f"{where} (not the last segment)")
        if buf.count(0, stop) == len(buf) - stop:
            return records
        claim = durable_claim_after(buf, buf_position, stop)
        if claim is not None and claim[1] > buf_position + stop:
            raise CorruptLogError(
                f"{where}; the intact entry at offset {start + claim[0]} was written when the log"
                f" was durable to position {claim[1]}, past the damage"
            )
        if not shows_crash_marks(buf, stop, start, _SECTOR_BYTES, claim is not None):
            raise CorruptLogError(f"{where}; not a torn write: no zeroed sector, and the file"
                                  " does not end within the entry")
        log.warning("%s: cutting a torn tail of %d bytes", where, file_bytes - start - stop)
        return records

    def _reconcile_index(self, seg: _Segment, index_buf: bytes, records: Records) -> None:
        """Make the index file hold exactly the records of the data file (derived data)."""
        expected = encode_index_records(records)
        if index_buf == expected:
            return
        common_bytes = common_record_count(index_buf, expected) * INDEX_RECORD_BYTES
        os.ftruncate(seg.index_fd, common_bytes)
        _pwrite_all(seg.index_fd, expected[common_bytes:], common_bytes)
        self._fsync(seg.index_fd)

    # -- test-only faults ---------------------------------------------------------------------

    def power_loss(self, rng: random.Random | None = None, tear: bool = False) -> int:
        """Test only: make the files look as after a power loss, then close the store.

        Discards every byte written since the last ``sync()`` (files created since are removed).
        With ``tear``, sealed segments keep what their seal made durable, and the last segment
        keeps some of its unsynced bytes: either a random prefix (tearing the last write, maybe
        mid-entry) or, as pages reach a disk in any order, each unsynced sector or none of it,
        independently, in a file still holding its zero-filled tail. Its index keeps a random
        prefix of its unsynced records. Returns the number of data bytes discarded.
        """
        self._check_usable()
        rng = rng if rng is not None else random.Random(0)
        discarded_bytes = 0
        for seg in list(self._segments):
            last = seg is self._segments[-1]
            if tear and last and rng.random() < 0.5:
                discarded_bytes += self._scramble_unsynced(seg, rng)
                data_bytes = None
                index_bytes = rng.randint(seg.durable_entry_count, seg.entry_count)
                index_bytes *= INDEX_RECORD_BYTES
            elif tear:
                data_bytes, index_bytes = self._torn_sizes(seg, last, rng)
            elif seg.created_since_sync:
                discarded_bytes += seg.data_bytes
                self._delete_segment(seg)
                self._segments.remove(seg)
                continue
            else:
                data_bytes = seg.synced_data_bytes
                index_bytes = seg.synced_entry_count * INDEX_RECORD_BYTES
            # Records still pending were never written: they cannot survive.
            index_bytes = min(index_bytes, seg.index_records_in_file * INDEX_RECORD_BYTES)
            seg.pending_index.clear()
            if data_bytes is not None:
                discarded_bytes += seg.data_bytes - data_bytes
                os.ftruncate(seg.data_fd, data_bytes)
            os.ftruncate(seg.index_fd, index_bytes)
        self._release(tidy=False)
        return discarded_bytes

    @staticmethod
    def _scramble_unsynced(seg: _Segment, rng: random.Random) -> int:
        """Zero each sector of the unsynced data (from the last fsync on) with probability 1/2;
        returns the bytes zeroed."""
        zeroed_bytes = 0
        offset = seg.durable_data_bytes
        while offset < seg.data_bytes:
            end = min((offset // _SECTOR_BYTES + 1) * _SECTOR_BYTES, seg.data_bytes)
            if rng.random() < 0.5:
                _pwrite_all(seg.data_fd, _ZEROS[: end - offset], offset)
                zeroed_bytes += end - offset
            offset = end
        return zeroed_bytes

    @staticmethod
    def _torn_sizes(seg: _Segment, last: bool, rng: random.Random) -> tuple[int, int]:
        if not last:
            return seg.durable_data_bytes, seg.durable_entry_count * INDEX_RECORD_BYTES
        data_lo, data_hi = seg.durable_data_bytes, seg.data_bytes
        index_lo = seg.durable_entry_count * INDEX_RECORD_BYTES
        index_hi = seg.entry_count * INDEX_RECORD_BYTES
        return rng.randint(data_lo, data_hi), rng.randint(index_lo, index_hi)
