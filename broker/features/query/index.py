"""The key index: derived data that finds messages by key (``topic#key``, RocketMQ's form) and by
unique key (the client's msg id), on disk in rotating ``broker.features.query.index_file`` files under
``<data dir>/index/``.

What is indexed comes from each log entry alone (the registry's ``stored_topics``:
topic, slot, keys, unique key, store time), so that every replica derives the same files from
the same entries: a file is full when the next entry's keys do not fit (never split), and the
next file is named by that entry's log index. Copies in the schedule topic and the broker's
``RMQ_SYS_`` topics are not indexed (a delayed message is found in its real topic once
delivered). A hit is only a candidate: the query (``broker.features.query.lookup``) reads its message from the
log and checks it against the consume queues (a dedup-refused duplicate, a hash collision or a
timer delivered twice do not show).

Durability: the index keeps its own applied index. ``checkpoint`` (before the broker writes its
own checkpoint, and at the same applied index) makes it durable; after a restart the index
resumes from its files and ``catch_up`` indexes what the log holds between them and the state's
checkpoint, so it never lags. A damaged file is deleted with every later one and rebuilt from
the log. Old files are deleted by a count bound and once log retention has deleted every entry
they name. Memory: the active file's slot table (4 bytes a slot) and one mapping per file.
"""

from __future__ import annotations

import fcntl
import logging
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from broker.core.entries import StoredSend
from broker.core.registry import EntryRegistry
from broker.features.delay.model import SCHEDULE_TOPIC
from broker.features.query.index_file import IndexFile, IndexFileError
from protocol.broker_errors import BadEntryError
from protocol.broker_kinds import SCOPE_CHARS, SCOPE_MARK, message_id
from protocol.topics import TRACE_TOPIC

log = logging.getLogger("broker.features.query.index")

INDEX_DIR = "index"
SUFFIX = ".idx"
UNIQUE_SEED = b"\x00U"  # unique keys hash apart from "topic#key" strings
VISITS_MAX = 100_000  # entries one query walks at most, over every file


@dataclass(frozen=True)
class IndexConfig:
    slots: int = 1 << 20  # per file: 4 MiB of slot table (RocketMQ: 5 million)
    entries_per_file: int = 4 << 20  # 28 bytes each: a 116 MiB file (sparse until filled)
    files_max: int = 64  # the oldest file is deleted past this many (0: no bound)

    def __post_init__(self) -> None:
        if self.slots < 1 or self.entries_per_file < 1 or self.files_max < 0:
            raise ValueError("the index needs at least one slot and one entry per file")


def key_hash(topic: str, key: str) -> int:
    return zlib.crc32(f"{topic}#{key}".encode("utf-8", "surrogatepass"))


_UNIQUE_START = zlib.crc32(UNIQUE_SEED)


def unique_hash(unique_key: str) -> int:
    return zlib.crc32(unique_key.encode("utf-8", "surrogatepass"), _UNIQUE_START)


def indexed_topic(topic: str) -> bool:
    # The trace topic is indexed: a message's trace records are found by its keys there
    # (``dledger message trace``); the other RMQ_SYS_ topics (transactions' halves) are not.
    return topic == TRACE_TOPIC or (topic != SCHEDULE_TOPIC and not topic.startswith("RMQ_SYS_"))


def entry_hashes(entry: object, registry: EntryRegistry) -> tuple[int, list[int]]:
    """(store time, [key hash, slot, key hash, slot...]) of what one decoded entry stores (flat:
    the replicas' apply path builds no tuple per key)."""
    if type(entry) is StoredSend:  # the hot path: a send of one run
        topic = entry.topic
        return entry.store_ts_ms, _run_hashes(topic, entry.messages, 0, []) \
            if indexed_topic(topic) else []
    stored = registry.stored_topics(entry)
    if stored is None:
        return 0, []
    out: list[int] = []
    slot = 0
    for topic, _, messages in stored[1]:
        if indexed_topic(topic):
            _run_hashes(topic, messages, slot, out)
        slot += len(messages)
    return stored[0], out


def _run_hashes(topic: str, messages: list[Any], slot: int, out: list[int]) -> list[int]:
    """Append the hashes of one run's messages (its first at ``slot``) to ``out``."""
    crc, seed, add = zlib.crc32, _UNIQUE_START, out.append
    for m in messages:
        keys, unique_key = m[2], m[3]
        if keys:
            for k in keys:
                add(key_hash(topic, k))
                add(slot)
        if unique_key:  # by the id consumers see (a stored key is scoped: ``message_id``)
            if m[4]:
                unique_key = message_id(unique_key, m[4])
            elif len(unique_key) > SCOPE_CHARS and unique_key[-SCOPE_CHARS] == SCOPE_MARK:
                unique_key = unique_key[:-SCOPE_CHARS]  # (``unscoped``, inlined: no properties)
            add(crc(unique_key.encode("utf-8", "surrogatepass"), seed))
            add(slot)
        slot += 1
    return out


def decoded(payload: bytes, registry: EntryRegistry) -> object:
    """A log entry's payload as the state machine decoded it at apply (None: it stored nothing)."""
    if not payload:
        return None
    try:
        return registry.decode_for_apply(payload)
    except BadEntryError:
        return None


class KeyIndex:
    def __init__(self, directory: str, config: IndexConfig, registry: EntryRegistry) -> None:
        self.dir, self.config, self.registry = directory, config, registry
        self.files: list[IndexFile] = []
        self._unsynced: list[IndexFile] = []  # sealed since the last checkpoint
        self._dir_dirty = False
        self._busy = False  # a checkpoint job is running: no file may be closed meanwhile
        self.rebuilt_files = 0
        self.failed: str | None = None  # a write failed (a full disk): indexing stopped
        self._dir_fd: int | None = None
        self.checkpointed_index = 0  # the applied index of the last checkpoint written
        self._written: list[int] = []  # set by a job that finished (in its thread)

    @classmethod
    def open(cls, data_dir: str, registry: EntryRegistry,
             config: IndexConfig | None = None) -> KeyIndex:
        """The index under ``data_dir``: its valid files, a damaged one and those after it
        deleted (to be rebuilt from the log), and an active file to write into."""
        index = cls(os.path.join(data_dir, INDEX_DIR), config or IndexConfig(), registry)
        os.makedirs(index.dir, exist_ok=True)
        index._dir_fd = fd = os.open(index.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            raise IndexFileError(f"{index.dir}: in use by another broker") from err
        names = sorted(n for n in os.listdir(index.dir) if n.endswith(SUFFIX))
        for k, name in enumerate(names):
            path = os.path.join(index.dir, name)
            problem = index._load(path, name)
            if problem is not None:
                log.warning("key index: %s; rebuilding it and %d later file(s) from the log",
                            problem, len(names) - k - 1)
                for later in names[k:]:
                    os.unlink(os.path.join(index.dir, later))
                index.rebuilt_files = len(names) - k
                index._dir_dirty = True
                break
        if not index.files or index.files[-1].sealed:
            index._new_file(index.applied_index + 1)
        return index

    def _load(self, path: str, name: str) -> str | None:
        try:
            first = int(name[: -len(SUFFIX)])
        except ValueError:
            return f"{name} is not named by its first index"
        expected = self.applied_index + 1 if self.files else first
        if first != expected or (self.files and not self.files[-1].sealed):
            return f"{name} does not follow {os.path.basename(self.files[-1].path)}"
        try:
            f = IndexFile.open(path)
        except (IndexFileError, OSError, ValueError) as err:
            return str(err)
        if f.first_index != first:
            f.close()
            return f"{name} names index {f.first_index}"
        self.files.append(f)
        return None

    @property
    def applied_index(self) -> int:
        return self.files[-1].applied_index if self.files else 0

    def _new_file(self, first_index: int) -> IndexFile:
        path = os.path.join(self.dir, f"{first_index:020d}{SUFFIX}")
        f = IndexFile.create(path, first_index, self.config.slots, self.config.entries_per_file)
        self.files.append(f)
        self._dir_dirty = True
        return f

    # -- the apply path ----------------------------------------------------------------------

    def add(self, index: int, position: int, entry: object) -> None:
        """Index one applied entry, decoded (``BrokerState.last_entry``; ``decoded``); one
        already indexed (after a restart) is skipped."""
        active = self.files[-1]
        if index <= active.applied_index or self.failed is not None:
            return
        active.applied_index = index
        if entry is None:
            return
        ts, hashes = entry_hashes(entry, self.registry)
        if not hashes:
            return
        if len(hashes) > 2 * active.capacity:
            hashes = hashes[: 2 * active.capacity]  # the same cut on every replica
            log.warning("key index: entry %d has more keys than a file holds; %d indexed",
                        index, active.capacity)
        if len(hashes) > 2 * active.room():
            try:
                active = self._rotate(active, index)
            except OSError as err:
                self._fail(err)
                return
        active.add(hashes, position, ts)

    def _rotate(self, active: IndexFile, index: int) -> IndexFile:
        active.applied_index = index - 1
        active.checkpoint(seal=True)
        self._unsynced.append(active)
        active = self._new_file(index)
        active.applied_index = index
        self._enforce_count()
        return active

    def _fail(self, err: OSError) -> None:
        """Stop indexing (the node carries on): a restart rebuilds what is missing from the log."""
        self.failed = f"{type(err).__name__}: {err}"
        log.error("key index: a write failed, indexing stops until a restart: %s", err)

    def end_batch(self) -> None:
        """After each applied batch: its index entries written, in one write."""
        if self.failed is None:
            try:
                self.files[-1].write_pending()
            except OSError as err:
                self._fail(err)

    # -- durability ----------------------------------------------------------------------------

    def checkpoint(self, log_first_index: int = 1) -> Callable[[], None]:
        """Capture the index as it stands (call it on the loop, at the applied index the
        broker's checkpoint snapshot has) and return the job that makes it durable; run the job
        (in a thread) and let it finish before writing the broker's checkpoint, then call
        ``checkpoint_done``. Deletes files log retention has emptied, and those past the count.
        After a failed write it writes nothing: the files keep what they last made durable."""
        if self.failed is not None:
            self._busy = True
            return lambda: None
        self._retain(log_first_index)
        self._enforce_count()
        jobs = [*(lambda fd=f.fd: os.fsync(fd) for f in self._unsynced),
                self.files[-1].checkpoint()]
        self._unsynced = []
        sync_dir = self._dir_dirty
        self._dir_dirty = False
        self._busy = True
        directory, applied, written = self.dir, self.applied_index, self._written

        def job() -> None:
            for j in jobs:
                j()
            if sync_dir:
                fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            written.append(applied)
        return job

    def checkpoint_done(self) -> None:
        """After the job (whether it ran to the end or failed): files may be deleted again."""
        self._busy = False
        if self._written:
            self.checkpointed_index = max(self.checkpointed_index, *self._written)
            self._written.clear()
        self._enforce_count()

    def _retain(self, log_first_index: int) -> None:
        """Delete sealed files whose entries the log no longer holds."""
        while len(self.files) > 1 and self.files[0].applied_index < log_first_index \
                and not self._busy:
            self._delete_oldest()

    def _enforce_count(self) -> None:
        limit = self.config.files_max
        while limit and len(self.files) > max(1, limit) and not self._busy:
            self._delete_oldest()

    def _delete_oldest(self) -> None:
        f = self.files.pop(0)
        if f in self._unsynced:
            self._unsynced.remove(f)
        f.close()
        os.unlink(f.path)
        self._dir_dirty = True

    def close(self) -> None:
        for f in self.files:
            try:
                f.close()
            except OSError as err:  # its last entries unwritten: rebuilt at the next start
                log.warning("key index: closing %s: %s", f.path, err)
        self.files = []
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None

    # -- queries -------------------------------------------------------------------------------

    def candidates(self, key_hash_: int, begin_ms: int = 0,
                   end_ms: int = 2**63 - 1) -> Iterator[tuple[int, int, int]]:
        """(position, slot, store time) of the entries with that hash stored in [begin_ms,
        end_ms], newest first, within a bounded walk (``VISITS_MAX``)."""
        visits = VISITS_MAX
        for f in reversed(self.files):
            for hit in f.chain(key_hash_, begin_ms, end_ms, visits):
                visits -= 1
                yield hit
            if visits <= 0:
                return

    def status(self) -> dict[str, Any]:
        return {"files": len(self.files), "applied_index": self.applied_index,
                "entries": sum(f.count for f in self.files), "rebuilt_files": self.rebuilt_files,
                "checkpointed_index": self.checkpointed_index, "failed": self.failed}


def catch_up(index: KeyIndex, log_dir: str, upto: int, verify_checksums: bool = True,
             opened: Any = None) -> int:
    """Index the log's entries after ``index.applied_index`` up to ``upto`` (the state machine's
    checkpoint: the node replays only what follows it). Entries log retention deleted are
    skipped. ``opened``: the node's log store, open (else the directory is opened here).
    Returns how many entries were read."""
    from dledger.raft.types import EntryKind
    from dledger.storage.commitlog import FileLogStore  # (the broker's pure modules import no storage)

    if index.applied_index >= upto or (opened is None and not os.path.isdir(log_dir)):
        return 0
    store = opened or FileLogStore.open(log_dir, verify_checksums=verify_checksums)
    read = 0
    try:
        lo = max(index.applied_index + 1, store.first_index())
        hi = min(upto, store.last_index())
        while lo <= hi:
            for e in store.entries(lo, hi + 1, 4 << 20):
                index.add(e.index, store.position_of(e.index),
                          decoded(e.data, index.registry) if e.kind is EntryKind.NORMAL else None)
                lo = e.index + 1
                read += 1
            index.end_batch()
    finally:
        if opened is None:
            store.close()
    return read


def open_index(data_dir: str, config: IndexConfig, registry: EntryRegistry, upto: int,
               verify_checksums: bool = True, store: Any = None) -> KeyIndex:
    """The node's key index, caught up from its log to ``upto`` (the state's checkpoint);
    ``store``: the node's log store, if it is open."""
    index = KeyIndex.open(data_dir, registry, config)
    try:
        read = catch_up(index, os.path.join(data_dir, "log"), upto, verify_checksums, store)
    except BaseException:
        index.close()
        raise
    if read:
        log.info("key index: %d log entries indexed to catch up with the checkpoint", read)
    return index
