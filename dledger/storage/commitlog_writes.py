"""The commitlog's writes: appends, suffix truncation, the roll-back of a failed append, and
group commit (``sync``, and the runtime's background ``sync_begin`` / ``sync_end``).

Owns how entries reach the segment files (one pwrite per file touched, into the zero-filled
tail; a new segment only after the last one is sealed) and how a cut is made durable at once
(later segments deleted, the holding one cut, each step fsynced). The rules are in
``dledger.storage.commitlog``; byte layouts in ``entry_codec``. It must not decide when to sync (the
runtime does) nor interpret entry bodies.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence

from dledger.raft.types import Entry
from dledger.storage.commitlog_reads import LogReads
from dledger.storage.entry_codec import INDEX_RECORD_BYTES, Chunk, plan_chunks
from dledger.storage.hardstate import storage_error
from dledger.storage.segment import (
    ZERO_FILL_STEP_BYTES,
    ZEROS,
    Segment,
    SyncToken,
    cut_zero_tail,
    pwrite_all,
    write_index,
)
from protocol.errors import StorageError

__all__ = ["LogWrites"]


class LogWrites(LogReads):
    """Appends, truncation and group commit of ``FileLogStore``."""

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
                pwrite_all(seg.data_fd, b"".join(chunk.data), seg.data_bytes)  # data first
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

    def _segment_for(self, chunk: Chunk) -> Segment:
        if not chunk.new_segment:
            return self._segments[-1]
        if self._segments:
            self._seal(self._segments[-1])
        seg = self._open_segment_files(chunk.base_position, self.last_index() + 1, exclusive=True)
        self._segments.append(seg)
        self._dir_dirty = True
        self._dir_generation += 1
        return seg

    def _zero_fill(self, seg: Segment, end_bytes: int) -> None:
        """Extend the data file with zeros to hold ``end_bytes`` and a step more (within the
        segment size): its size then changes once per step, not with every append. The next
        sync makes the zeros durable. A disk too full for them gets none (see below)."""
        target = max(end_bytes, min(end_bytes + ZERO_FILL_STEP_BYTES, self._segment_bytes_max))
        offset = seg.file_bytes
        try:
            while offset < target:
                piece = ZEROS[: min(target - offset, len(ZEROS))]
                pwrite_all(seg.data_fd, piece, offset)
                offset += len(piece)
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
            # A nearly full disk: no room to run ahead. Drop the zeros; the entries' own write
            # extends the file, as an append would (and fails as one would if even that is short).
            os.ftruncate(seg.data_fd, seg.file_bytes)
            return
        seg.file_bytes = target

    def _seal(self, seg: Segment) -> None:
        """Make a segment wholly durable before a later one gets bytes (see module docstring)."""
        cut_zero_tail(seg)
        write_index(seg)
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
            for later in reversed(self._segments[keep:]):
                self._delete_segment(later)
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

    def _cut_segment(self, seg: Segment, data_bytes: int, entry_count: int) -> None:
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
        ``datasync`` replaces os.fdatasync for the data files (``dledger.storage.aiofsync``)."""
        self._check_usable()
        try:
            for seg in self._dirty:
                # Only the data is fsynced on the hot path: the index of the last segment is
                # derived data that open() verifies and rebuilds from the data (sealing a
                # segment fsyncs its index too).
                write_index(seg)
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
                write_index(seg)
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
