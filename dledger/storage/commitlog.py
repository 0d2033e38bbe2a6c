"""The file-backed Raft log: a segmented, append-only, checksummed commitlog (``FileLogStore``).

Owns one node's log directory: its data and index files, their recovery after a crash, group
commit (``sync``), suffix truncation and whole-segment retention. It must not interpret entry
bodies (the broker does) nor decide when to sync (the runtime does); byte layouts live in
``entry_codec``.

This module is the store's front (``open``, retention) and states the rules below; the parts
are ``segment`` (one segment's files), ``commitlog_reads`` (state in memory, files, reads),
``commitlog_writes`` (appends, truncation, group commit), ``commitlog_recovery`` (open after a
crash) and ``commitlog_faults`` (test-only power loss).

A log directory holds:
- ``<position:020d>.data``: entries back to back, the file named by the logical position of its
  first entry. An entry's position is that name plus its offset in the file (no padding), so it
  depends only on the entries before it and is the same on every replica holding them.
  The last segment's file runs ahead of its entries: it is filled with zeros a step
  (``ZERO_FILL_STEP_BYTES``) at a time, and entries are written into it in place. So the
  fdatasync of a group commit writes data pages only, and need not commit a new file size
  through the filesystem's journal, which all replicas on one disk share: in a live group on
  ext4 that made each replica's flush about 80-100 us faster (docs/performance.md). A sealed
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
  and must be reopened, as after a crash. The node does that itself when the disk was full
  (``DiskFullError``, see ``dledger.node.disk_full``); on any other failure it stops.
- The directory is locked (``flock``) while a store has it open.

In memory the store keeps two ``array('q')`` (position and term of every entry held), so
``term_at`` and ``position_of`` cost one lookup and reads cost one ``pread`` per segment touched.
"""

from __future__ import annotations

import fcntl
import os

from dledger.storage.commitlog_faults import PowerLossFaults
from dledger.storage.commitlog_recovery import LogRecovery
from dledger.storage.commitlog_writes import LogWrites
from dledger.storage.entry_codec import HEADER_BYTES, FrameError, encode_meta
from dledger.storage.hardstate import make_dirs_durably, storage_error, write_file_atomically
from dledger.storage.segment import META_NAME, ZERO_FILL_STEP_BYTES, SyncToken
from protocol.errors import CorruptLogError, StorageError

__all__ = ["DEFAULT_SEGMENT_BYTES_MAX", "ZERO_FILL_STEP_BYTES", "FileLogStore", "SyncToken"]

DEFAULT_SEGMENT_BYTES_MAX = 64 * 1024 * 1024


class FileLogStore(LogWrites, LogRecovery, PowerLossFaults):
    """A ``LogStore`` in a directory of segment files. Create with ``FileLogStore.open``."""

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

    def snapshot_files(self, upto: int) -> tuple[bytes, list[tuple[str, str, int]]]:
        """What a snapshot at index ``upto`` brings of this log: the meta record of where the
        log starts, and (file name, path, bytes) of each data file's part up to the end of entry
        ``upto``. Those bytes are committed and never change; the caller opens the files at
        once (retention may delete them later, an open file stays readable)."""
        self._check_usable()
        if not self._base_index <= upto <= self.last_index():
            raise IndexError(f"index {upto} not held ({self.first_index()}..{self.last_index()})")
        meta = encode_meta(self._base_index, self._base_term, self._base_position)
        k = upto - self._base_index
        end = self._positions[k] if k < len(self._positions) else self._end_position
        out = []
        for seg in self._segments:
            if seg.first_index > upto:
                break
            out.append((os.path.basename(seg.data_path), seg.data_path,
                        min(seg.data_bytes, end - seg.base_position)))
        return meta, out

    def segment_files(self) -> list[tuple[int, str]]:
        """(first index, data file path) of each segment, oldest first (for retention's
        rules, which look at the files' last write times)."""
        self._check_usable()
        return [(seg.first_index, seg.data_path) for seg in self._segments]

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
            write_file_atomically(self._path(META_NAME), meta)
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
