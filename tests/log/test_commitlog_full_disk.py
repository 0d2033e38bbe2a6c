"""The commitlog on a full disk: a failed write loses nothing and a retry succeeds, a failed
fsync stops the store until it is reopened, retention on a full disk keeps it usable, and bad
arguments or a closed store raise named errors."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from dledger.storage import commitlog
from dledger.storage.commitlog import FileLogStore
from dledger.storage.entry_codec import INDEX_RECORD_BYTES
from protocol.errors import DiskFullError, StorageError
from tests.log.commitlog_files import (
    ALL_BYTES,
    FILL_SEGMENT_BYTES_MAX,
    all_entries,
    data_files,
    filled_store,
    make_entries,
)


@pytest.mark.parametrize("failing_write", [0, 1, 3])
def test_a_full_disk_loses_nothing_and_a_retry_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_write: int
) -> None:
    """Write 0 is the data of the current segment (into its zero-filled tail), 1 its index
    (written as the segment is sealed), 2 the zero fill of a new segment (next test), 3 the data
    of the new one (its index waits for the next sync)."""
    store = FileLogStore.open(tmp_path, segment_bytes_max=1024)
    before = make_entries(1, 1, [300])
    store.append(before)
    store.sync()
    first_data = data_files(tmp_path)[0]
    assert first_data.stat().st_size == 1024  # zero-filled up to the segment size
    sizes_before = {p.name: p.stat().st_size for p in tmp_path.iterdir()}
    sizes_before[first_data.name] = 348  # a roll back cuts the zeros off too
    real_pwrite, calls = os.pwrite, []

    def full_disk_once(fd: int, data: bytes, offset: int) -> int:
        calls.append(fd)
        if len(calls) == failing_write + 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(commitlog.os, "pwrite", full_disk_once)
    batch = make_entries(2, 1, [300] * 3)
    with pytest.raises(DiskFullError):
        store.append(batch)
    assert store.last_index() == 1 and store.end_position() == 348
    assert {p.name: p.stat().st_size for p in tmp_path.iterdir()} == sizes_before
    store.append(batch)
    monkeypatch.undo()
    store.sync()
    store.close()
    store = FileLogStore.open(tmp_path, segment_bytes_max=1024, verify_all=True)
    assert all_entries(store) == before + batch
    store.close()


def test_a_disk_too_full_to_zero_fill_ahead_still_takes_the_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_pwrite = os.pwrite

    def no_room_for_zeros(fd: int, data: bytes, offset: int) -> int:
        if not any(data):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(commitlog.os, "pwrite", no_room_for_zeros)
    store = FileLogStore.open(tmp_path)
    entries = make_entries(1, 1, [300] * 3)
    store.append(entries[:2])
    store.append(entries[2:])
    assert data_files(tmp_path)[0].stat().st_size == 3 * 348  # grown by the entries alone
    store.sync()
    monkeypatch.undo()
    store.close()
    store = FileLogStore.open(tmp_path, verify_all=True)
    assert all_entries(store) == entries
    store.close()


def test_a_short_index_write_on_a_full_disk_leaves_whole_records_and_a_retry_writes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileLogStore.open(tmp_path)
    entries = make_entries(1, 1, [100] * 5)
    store.append(entries)  # data written; the index records wait for the sync
    index_file = next(tmp_path.glob("*.index"))
    assert index_file.stat().st_size == 0
    real_pwrite, calls = os.pwrite, []

    def short_then_full(fd: int, data: bytes, offset: int) -> int:
        calls.append(fd)
        if len(calls) == 1:  # a record and a bit
            return real_pwrite(fd, bytes(data[: INDEX_RECORD_BYTES + 7]), offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(commitlog.os, "pwrite", short_then_full)
    with pytest.raises(DiskFullError):
        store.sync()
    assert index_file.stat().st_size == 0  # cut back: the pending records are written again
    monkeypatch.undo()
    store.sync()
    assert index_file.stat().st_size == 5 * INDEX_RECORD_BYTES
    store.close()
    store = FileLogStore.open(tmp_path, verify_all=True)
    assert all_entries(store) == entries
    store.close()


def test_a_failed_fsync_stops_the_store_until_reopened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a failed fsync the kernel may have dropped the dirty pages: never retry it."""
    store = FileLogStore.open(tmp_path)
    store.append(make_entries(1, 1, [10, 20]))

    def io_error(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(commitlog.os, "fdatasync", io_error)
    with pytest.raises(StorageError, match="syncing"):
        store.sync()
    monkeypatch.undo()
    with pytest.raises(StorageError, match="reopen"):
        store.append(make_entries(3, 1, [1]))
    store.close()
    store = FileLogStore.open(tmp_path)
    assert store.last_index() == 2
    store.close()


def test_bad_arguments_and_a_closed_store_raise_named_errors(tmp_path: Path) -> None:
    store = FileLogStore.open(tmp_path)
    store.append(make_entries(1, 1, [1, 2, 3]))
    with pytest.raises(StorageError, match="outside"):
        store.append(make_entries(5, 1, [1]))
    with pytest.raises(StorageError, match="contiguous"):
        store.append([*make_entries(4, 1, [1]), *make_entries(6, 1, [1])])
    assert store.last_index() == 3
    with pytest.raises(IndexError):
        store.term_at(4)
    with pytest.raises(IndexError):
        store.position_of(0)
    assert store.term_at(0) == 0 and list(store.entries(4, 9, ALL_BYTES)) == []
    assert [e.index for e in store.entries(1, 9, 0)] == [1]  # at least one entry
    store.append([])
    store.close()
    store.close()
    with pytest.raises(StorageError, match="closed"):
        store.entries(1, 2, ALL_BYTES)
    with pytest.raises(ValueError):
        FileLogStore.open(tmp_path, segment_bytes_max=10)


def test_a_full_disk_during_retention_keeps_the_store_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = filled_store(tmp_path)
    store = FileLogStore.open(tmp_path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX)

    def no_space(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(commitlog.os, "write", no_space)
    with pytest.raises(DiskFullError):
        store.retain_from(7)
    monkeypatch.undo()
    assert store.first_index() == 1 and len(data_files(tmp_path)) == 4
    assert store.retain_from(7) == 7
    assert all_entries(store) == entries[6:]
    store.close()
