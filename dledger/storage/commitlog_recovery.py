"""The commitlog's recovery on open: what a crash may have left in a log directory is checked
and cut back to a durable log prefix.

Owns the steps of ``FileLogStore.open`` after the directory is locked: temp files and segments
that retention had not finished deleting are removed, the ``meta`` file is read, the last
segment (every one with ``verify_all``) is verified entry by entry, a torn tail is told from
damage (the rules are in ``dledger.storage.commitlog``) and cut, index files are rebuilt or cut back
from their data, and the result is fsynced. It must not write entries.
"""

from __future__ import annotations

import logging
import os

from dledger.storage.commitlog_reads import LogReads
from dledger.storage.entry_codec import (
    DATA_SUFFIX,
    INDEX_RECORD_BYTES,
    INDEX_SUFFIX,
    FrameError,
    Records,
    common_record_count,
    decode_meta,
    durable_claim_after,
    encode_index_records,
    parse_index,
    scan_entries,
    segment_file_name,
    shows_crash_marks,
)
from dledger.storage.hardstate import TEMP_SUFFIX
from dledger.storage.segment import META_NAME, SECTOR_BYTES, Segment, bases_named, pread_exact, pwrite_all
from protocol.errors import CorruptLogError

__all__ = ["LogRecovery"]

log = logging.getLogger("dledger.storage.commitlog")


class LogRecovery(LogReads):
    """Recovery of ``FileLogStore`` (run once, by ``open``)."""

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
        path = self._path(META_NAME)
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
        data_bases = sorted(bases_named(names, DATA_SUFFIX))
        index_bases = set(bases_named(names, INDEX_SUFFIX))
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
        index_buf = pread_exact(seg.index_fd, os.fstat(seg.index_fd).st_size, 0)
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

    def _scan_rest(self, seg: Segment, records: Records, file_bytes: int, last: bool) -> Records:
        """Verify the data past what ``records`` covers. In the last segment the entries end at
        the first bad one (the caller cuts the rest) if only zeros follow (the zero-filled
        tail), or if it is a torn write: it shows a crash's marks and no intact entry after it
        says it was durable. Anything else is ``CorruptLogError``."""
        start = records.end_position(seg.base_position) - seg.base_position
        if start == file_bytes:
            return records
        buf = pread_exact(seg.data_fd, file_bytes - start, start)
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
        if not shows_crash_marks(buf, stop, start, SECTOR_BYTES, claim is not None):
            raise CorruptLogError(f"{where}; not a torn write: no zeroed sector, and the file"
                                  " does not end within the entry")
        log.warning("%s: cutting a torn tail of %d bytes", where, file_bytes - start - stop)
        return records

    def _reconcile_index(self, seg: Segment, index_buf: bytes, records: Records) -> None:
        """Make the index file hold exactly the records of the data file (derived data)."""
        expected = encode_index_records(records)
        if index_buf == expected:
            return
        common_bytes = common_record_count(index_buf, expected) * INDEX_RECORD_BYTES
        os.ftruncate(seg.index_fd, common_bytes)
        pwrite_all(seg.index_fd, expected[common_bytes:], common_bytes)
        self._fsync(seg.index_fd)
