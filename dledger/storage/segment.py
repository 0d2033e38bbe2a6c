"""One commitlog segment's pair of files and the low-level file steps on them.

Owns ``Segment`` (a data file and its index file, with the sizes this process wrote, synced and
made durable), the ``SyncToken`` of a background group commit, and the small helpers every part
of ``FileLogStore`` writes and reads through: whole-buffer pwrite and pread, writing the pending
index records, cutting the zero-filled tail, naming and opening segment files. The rules these
files follow (layout, what may be torn, why the tail is zero-filled) are in ``dledger.storage.commitlog``.
It must not decide what to write or when to sync: the store does.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass, field

from dledger.storage.entry_codec import INDEX_RECORD_BYTES, FrameError, parse_segment_file_name

__all__ = [
    "META_NAME",
    "SECTOR_BYTES",
    "ZEROS",
    "ZERO_FILL_STEP_BYTES",
    "Segment",
    "SyncToken",
    "bases_named",
    "cut_zero_tail",
    "open_fd",
    "pread_exact",
    "pwrite_all",
    "write_index",
]

ZERO_FILL_STEP_BYTES = 1024 * 1024  # how far the last data file runs ahead of its entries
ZEROS = memoryview(bytes(ZERO_FILL_STEP_BYTES))
SECTOR_BYTES = 512  # a disk keeps each sector written since the last fsync whole or not at all
META_NAME = "meta"


@dataclass(eq=False)
class Segment:
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
    sizes: tuple[tuple[Segment, int, int], ...]  # segment, data bytes, entry count at begin


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
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


def write_index(seg: Segment) -> None:
    """Write the segment's pending index records (after their data: data before index). On an
    error they stay pending and the file is cut back to whole records (a short write first, as
    a full disk often does, would misalign the rest)."""
    if not seg.pending_index:
        return
    in_file = seg.index_records_in_file
    try:
        pwrite_all(seg.index_fd, b"".join(seg.pending_index), in_file * INDEX_RECORD_BYTES)
    except OSError:
        # If even the cut fails, open() still copes: the records' checksums stop at the first
        # bad one and the rest is rebuilt from the data.
        with contextlib.suppress(OSError):
            os.ftruncate(seg.index_fd, in_file * INDEX_RECORD_BYTES)
        raise
    seg.pending_index.clear()


def cut_zero_tail(seg: Segment) -> None:
    """Cut the data file back to its entries (not fsynced: the caller does, if it must)."""
    if seg.file_bytes > seg.data_bytes:
        os.ftruncate(seg.data_fd, seg.data_bytes)
        seg.file_bytes = seg.data_bytes


def pread_exact(fd: int, size: int, offset: int) -> bytes:
    parts, done = [], 0
    while done < size:
        part = os.pread(fd, size - done, offset + done)
        if not part:
            raise FrameError(f"file ends before offset {offset + size}")
        parts.append(part)
        done += len(part)
    return b"".join(parts)


def bases_named(names: list[str], suffix: str) -> list[int]:
    bases = (parse_segment_file_name(name, suffix) for name in names)
    return [base for base in bases if base is not None]


def open_fd(path: str, exclusive: bool) -> int:
    """Data and index files are written at known offsets (pwrite), never appended to."""
    flags = os.O_RDWR | os.O_CREAT | (os.O_EXCL if exclusive else 0)
    return os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
