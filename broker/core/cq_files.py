"""Consume queues in files (a broker process's ``QueueStore``): memory that does not grow with
the backlog.

Layout: ``<data dir>/consumequeue/<queue number, 10 digits>/<first offset, 20 digits>``, each file
``units_per_file`` 28-byte units (7 MiB by default), as RocketMQ's ConsumeQueue files. A queue keeps
in memory only the units not yet written (64 KiB of them at most, and 4 MiB for all queues
together; written in one ``pwrite`` each) and reads the rest with ``pread`` through the page cache.
Open files are shared through a bounded LRU of descriptors.

Crash safety is the checkpoint's: before a checkpoint is written the files are written and
fsynced (in a thread: ``sync_job``), and the checkpoint records each queue's length (and the CRC32
of all its units). A
restore cuts every file back to that length (units past it are applied again from the log) and
deletes the directories of queues the checkpoint does not name (created after it, or of a topic
deleted before it). A deleted topic's files stay until a checkpoint without it is on disk.
Retention (``trim``) deletes whole files from the front once the log no longer holds their
messages; the queue's first offset follows.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
from collections import OrderedDict
from typing import Any

from broker.core.consumequeue import UNIT, UNIT_BYTES, UnitQueue
from dledger.storage.hardstate import fsync_directory

log = logging.getLogger("broker.core.cq_files")

# Seeded bug (tests only): "cq_keep_tail" keeps, at a restore, the units a file holds past its
# checkpoint (``FileQueues``).
QUEUE_CANARIES = frozenset({"cq_keep_tail"})

UNITS_PER_FILE = 1 << 18
# Open files kept: a quarter of the process's soft limit, within these bounds. A checkpoint writes
# every queue with units not yet written, one file each: a cache smaller than the queues written
# between two checkpoints reopens every file, every checkpoint, on the event loop.
FDS_MIN, FDS_MAX = 64, 4096
FLUSH_BYTES = 1 << 16  # a queue's unwritten units are written once this many pile up
DIRTY_BYTES_MAX = 4 << 20  # or once all queues' unwritten units come to this many


class ConsumeQueueFilesError(ValueError):
    """The consume-queue files do not hold what the checkpoint says they do."""


class FileConsumeQueue(UnitQueue):
    __slots__ = ("store", "dir", "base", "flushed", "tail", "_file")

    def __init__(self, store: FileQueues, no: int, base: int, flushed: int, crc: int) -> None:
        super().__init__(no, crc)
        self.store = store
        self.dir = os.path.join(store.root, f"{no:010d}")
        self.base = base  # the first offset still in a file
        self.flushed = flushed  # units in files; the rest are in ``tail``
        self.tail = bytearray()
        self._file = (-1, "")  # the last file's first offset and path (formatted once)

    def __len__(self) -> int:
        return self.flushed + len(self.tail) // UNIT_BYTES

    def first(self) -> int:
        return self.base

    def _append(self, units: bytes | bytearray) -> None:
        store = self.store
        if not self.tail:
            store.dirty[self.no] = self
        self.tail += units
        store.dirty_bytes += len(units)
        if len(self.tail) >= FLUSH_BYTES or store.keep_tail:  # (the canary: at once, as a
            store.flush_safely(self)  # busy queue's are, so that a kill finds units past it)
        elif store.dirty_bytes >= DIRTY_BYTES_MAX:
            store.flush_safely()

    def _read(self, lo: int, hi: int) -> bytes:
        parts = []
        upf = self.store.units_per_file
        k = lo
        while k < min(hi, self.flushed):
            file_base = k - k % upf
            end = min(hi, self.flushed, file_base + upf)
            fd = self.store.fd(self._path(file_base))
            want = (end - k) * UNIT_BYTES
            data = os.pread(fd, want, (k - file_base) * UNIT_BYTES)
            if len(data) != want:
                raise ConsumeQueueFilesError(f"{self._path(file_base)} ends before unit {end}")
            parts.append(data)
            k = end
        if hi > self.flushed:
            lo_t = max(lo, self.flushed) - self.flushed
            parts.append(bytes(self.tail[lo_t * UNIT_BYTES:(hi - self.flushed) * UNIT_BYTES]))
        return b"".join(parts)

    def _path(self, file_base: int) -> str:
        if self._file[0] != file_base:
            self._file = (file_base, f"{self.dir}{os.sep}{file_base:020d}")
        return self._file[1]

    def flush(self) -> None:
        """Write the units in memory to their files (not fsynced: ``FileQueues.sync_job``). A
        failed write (a full disk) keeps the units not written in memory, to try again."""
        upf = self.store.units_per_file
        done = 0
        try:
            while done < len(self.tail):
                k = self.flushed
                file_base = k - k % upf
                n = min(len(self.tail) - done, (file_base + upf - k) * UNIT_BYTES)
                path = self._path(file_base)
                if k == file_base:
                    self.store.created.add(self.dir)
                with memoryview(self.tail) as view:
                    written = os.pwrite(self.store.fd(path), view[done:done + n],
                                        (k - file_base) * UNIT_BYTES)
                written -= written % UNIT_BYTES
                self.store.unsynced.add(path)
                done += written
                self.flushed += written // UNIT_BYTES
        finally:
            del self.tail[:done]
            self.store.dirty_bytes -= done
            if not self.tail:
                self.store.dirty.pop(self.no, None)

    def pending_writes(self) -> list[tuple[str, int, bytes]]:
        """The writes that would put this queue's units in memory in their files: (path, byte
        offset, units), each within one file; nothing changes (``QueuesSync``)."""
        upf, k = self.store.units_per_file, self.flushed
        file_base = k - k % upf
        if k + len(self.tail) // UNIT_BYTES <= file_base + upf:  # (the common case: one file)
            return [(self._path(file_base), (k - file_base) * UNIT_BYTES, bytes(self.tail))]
        out = []
        done = 0
        while done < len(self.tail):
            file_base = k - k % upf
            n = min(len(self.tail) - done, (file_base + upf - k) * UNIT_BYTES)
            out.append((self._path(file_base), (k - file_base) * UNIT_BYTES,
                        bytes(self.tail[done:done + n])))
            done += n
            k += n // UNIT_BYTES
        return out

    def written_up_to(self, length: int) -> None:
        """Units up to ``length`` are in their files (a ``QueuesSync`` wrote them): dropped from
        memory, unless a flush on the loop got there first."""
        n = length - self.flushed
        if n <= 0:
            return
        del self.tail[:n * UNIT_BYTES]
        self.flushed = length
        if self.store.dirty.get(self.no) is self:  # (a dropped queue's bytes are not counted)
            self.store.dirty_bytes -= n * UNIT_BYTES
            if not self.tail:
                del self.store.dirty[self.no]

    def files(self) -> list[tuple[int, str]]:
        """(first offset, path) of each file, oldest first."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted((int(n), os.path.join(self.dir, n)) for n in names if n.isdigit())

    def trim(self, first_position: int) -> int:
        """Delete the files whose every message is before ``first_position`` in the log (never
        the file being written); returns how many. A queue whose units written fit in one file
        has none to delete: told without a look at its directory (a checkpoint asks every queue)."""
        upf = self.store.units_per_file
        if self.flushed <= self.base or (self.flushed - 1) // upf == self.base // upf:
            return 0
        deleted = 0
        for file_base, path in self.files()[:-1]:
            last = UNIT.unpack(self._read(file_base + upf - 1, file_base + upf))
            if last[0] >= first_position:
                break
            self.store.forget_fd(path)
            os.unlink(path)
            self.base = file_base + upf
            deleted += 1
        return deleted


class FileQueues:
    """The broker's ``QueueStore``: queues in files under ``root``."""

    def __init__(self, root: str, units_per_file: int = UNITS_PER_FILE,
                 keep_tail: bool = False, fds_max: int | None = None) -> None:
        self.root = root
        self.units_per_file = units_per_file
        # The seeded bug (tests only: the cq_keep_tail canary): a restore keeps the units
        # written after the checkpoint, and the log's replay appends them again. (Units are
        # then written at once, as a busy queue's are: a quiet one's wait for the checkpoint.)
        self.keep_tail = keep_tail
        os.makedirs(root, exist_ok=True)
        self._fds: OrderedDict[str, int] = OrderedDict()  # path -> descriptor, least recent first
        self._dir_paths: dict[str, set[str]] = {}  # a queue's directory -> its paths open
        self.fds_max = fds_max if fds_max is not None else _fds_max()
        self.dirty: dict[int, FileConsumeQueue] = {}  # queues with units not yet written
        self.dirty_bytes = 0  # how many bytes of units they hold
        self.flush_failures = 0
        self.unsynced: set[str] = set()  # files written since the last sync
        self.created: set[str] = set()  # directories with files created since the last sync
        self.dropped: list[int] = []  # queues of deleted topics (files kept until a checkpoint)

    # -- QueueStore ----------------------------------------------------------------------------

    def create(self, no: int) -> UnitQueue:
        queue = FileConsumeQueue(self, no, 0, 0, 0)
        self._remove_dir(queue.dir)  # (a leftover of a state never checkpointed)
        os.makedirs(queue.dir)
        self.created.add(self.root)
        return queue

    def record(self, queue: UnitQueue) -> Any:
        assert isinstance(queue, FileConsumeQueue)
        return [len(queue), queue.crc]

    def restore(self, no: int, record: Any) -> UnitQueue:
        """A queue as a checkpoint recorded it: files cut back to its length."""
        if not (isinstance(record, list) and len(record) == 2
                and all(isinstance(x, int) and x >= 0 for x in record)):
            raise ValueError(f"malformed consume queue record {record!r}")
        length, crc = record
        queue = FileConsumeQueue(self, no, length, length, crc)
        upf = self.units_per_file
        files = queue.files()
        if self.keep_tail and files:
            length = max(length, files[-1][0] + os.path.getsize(files[-1][1]) // UNIT_BYTES)
            queue.flushed = length
        held = files[0][0] if files else length  # where the units held start
        for file_base, path in files:
            if file_base >= length:
                self.forget_fd(path)
                os.unlink(path)
                continue
            if file_base != held:
                raise ConsumeQueueFilesError(f"{path}: queue {no} has a gap before offset {file_base}")
            size = os.path.getsize(path) // UNIT_BYTES
            keep = min(upf, length - file_base)
            if size < keep and file_base + size < length:
                raise ConsumeQueueFilesError(
                    f"{path} holds {size} units, the checkpoint counts {keep} (queue {no})")
            if os.path.getsize(path) != keep * UNIT_BYTES:
                with open(path, "r+b") as f:
                    f.truncate(keep * UNIT_BYTES)
                self.unsynced.add(path)
            held = file_base + keep
        if files and held != length:
            raise ConsumeQueueFilesError(f"queue {no} holds units up to {held}, the checkpoint "
                                         f"counts {length}")
        queue.base = files[0][0] if files and files[0][0] < length else length
        os.makedirs(queue.dir, exist_ok=True)
        return queue

    def from_packed(self, no: int, packed: bytes) -> UnitQueue:
        queue = self.create(no)
        for unit in UNIT.iter_unpack(packed):
            queue.append(*unit)
        if isinstance(queue, FileConsumeQueue):
            queue.flush()
        return queue

    def drop(self, queue: UnitQueue) -> None:
        if self.dirty.pop(queue.no, None) is not None and isinstance(queue, FileConsumeQueue):
            self.dirty_bytes -= len(queue.tail)
        self.dropped.append(queue.no)

    # -- the shell's side ------------------------------------------------------------------------

    def keep_only(self, numbers: set[int]) -> None:
        """Delete the directories of queues not in ``numbers`` (a restore's reconciliation)."""
        for name in os.listdir(self.root):
            if not (name.isdigit() and int(name) in numbers):
                self._remove_dir(os.path.join(self.root, name))

    def flush(self) -> None:
        for queue in list(self.dirty.values()):
            queue.flush()

    def flush_safely(self, queue: FileConsumeQueue | None = None) -> None:
        """``flush`` (one queue or all) while applying: a failed write (a full disk) keeps the
        units in memory and is tried again at the next threshold or checkpoint."""
        try:
            queue.flush() if queue is not None else self.flush()
        except OSError as err:
            self.flush_failures += 1
            if self.flush_failures == 1 or self.flush_failures % 1000 == 0:
                log.warning("consume queue units not written yet (%d times): %s",
                            self.flush_failures, err)

    def sync_job(self) -> QueuesSync:
        """Every unit appended so far, to be written and made durable in a thread (before a
        checkpoint that counts it is written; then ``written()`` on the loop). The loop only
        copies the units in memory: they stay there, readable, until written."""
        writes = [w for q in self.dirty.values() for w in q.pending_writes()]
        new_files = {os.path.dirname(path) for path, offset, _ in writes if offset == 0}
        sync = QueuesSync(self, writes, [(q, len(q)) for q in self.dirty.values()],
                          sorted(self.unsynced), self.created | new_files)
        self.unsynced, self.created = set(), set()
        return sync

    def take_dropped(self) -> list[int]:
        """The queues dropped so far, whose directories go once a checkpoint without them is
        durable (``remove_queues`` then; put them back in ``dropped`` if it failed)."""
        dropped, self.dropped = self.dropped, []
        for no in dropped:
            self._forget_fds_under(self._dir(no))
        return dropped

    def remove_queues(self, numbers: list[int]) -> None:
        """Delete the queues' directories (blocking: run in a thread; their files are closed)."""
        for no in numbers:
            shutil.rmtree(self._dir(no), ignore_errors=True)

    def fd(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is not None:
            self._fds.move_to_end(path)
            return fd
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._fds[path] = fd
        self._dir_paths.setdefault(os.path.dirname(path), set()).add(path)
        if len(self._fds) > self.fds_max:
            self.forget_fd(next(iter(self._fds)))
        return fd

    def forget_fd(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)
            d = os.path.dirname(path)
            paths = self._dir_paths.get(d)
            if paths is not None:
                paths.discard(path)
                if not paths:
                    del self._dir_paths[d]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._dir_paths.clear()

    def _dir(self, no: int) -> str:
        return os.path.join(self.root, f"{no:010d}")

    def _forget_fds_under(self, path: str) -> None:
        """Close the files open in queue directory ``path`` (never a walk of every file open:
        a topic's creation and deletion do this for each of its queues)."""
        for p in list(self._dir_paths.get(path, ())):
            self.forget_fd(p)

    def _remove_dir(self, path: str) -> None:
        self._forget_fds_under(path)
        shutil.rmtree(path, ignore_errors=True)


class QueuesSync:
    """A checkpoint's consume-queue work in a thread (``__call__``): the units that were in memory
    written (each file opened for it: the loop's descriptors are the loop's), then every file
    written since the last sync fsynced, and the directories of new files. Then, back on the
    loop, ``written()`` lets the queues drop those units from memory. A failure (a full disk)
    raises, and the units stay in memory: written at the next checkpoint, or by a flush."""

    def __init__(self, store: FileQueues, writes: list[tuple[str, int, bytes]],
                 lengths: list[tuple[FileConsumeQueue, int]], paths: list[str],
                 dirs: set[str]) -> None:
        self.store = store
        self.writes, self.lengths, self.paths, self.dirs = writes, lengths, paths, sorted(dirs)

    def __call__(self) -> None:
        written = set()
        for path, offset, data in self.writes:  # (one file open at a time: a checkpoint may
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # write to thousands)
            try:
                done = 0
                while done < len(data):
                    done += os.pwrite(fd, data[done:], offset + done)
                os.fsync(fd)
            finally:
                os.close(fd)
            written.add(path)
        for path in self.paths:
            if path in written:
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # trimmed or dropped since
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for d in self.dirs:
            if os.path.isdir(d):
                fsync_directory(d)

    def written(self) -> None:
        """On the loop, once the call returned: the queues' units it wrote leave memory."""
        for queue, length in self.lengths:
            queue.written_up_to(length)

    def failed(self) -> None:
        """On the loop, once the call raised (or its checkpoint was not written): what it was
        to make durable is owed to the next."""
        self.store.unsynced.update(self.paths)
        self.store.created.update(self.dirs)


def _fds_max() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return FDS_MAX
    return max(FDS_MIN, min(FDS_MAX, soft // 4))
