"""The commitlog after damage: a bad checksum or frame anywhere but the torn tail is named
corruption (``CorruptLogError``), a torn tail is cut back to its complete entries, damaged index
files are rebuilt, and a crash or power loss keeps every fsynced entry."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from dledger.raft.types import Entry
from dledger.storage import commitlog
from dledger.storage.commitlog import FileLogStore
from dledger.storage.entry_codec import HEADER_BYTES, INDEX_RECORD_BYTES
from protocol.errors import CorruptLogError, DiskFullError
from tests.log.commitlog_files import (
    ALL_BYTES,
    FILL_SEGMENT_BYTES_MAX,
    all_entries,
    data_files,
    filled_store,
    flip_byte,
    make_entries,
)


def test_bad_checksum_in_a_non_last_segment_is_named(tmp_path: Path) -> None:
    filled_store(tmp_path)
    first = data_files(tmp_path)[0]
    flip_byte(first, 348 + HEADER_BYTES + 100)  # inside the second entry's body
    with pytest.raises(CorruptLogError, match=f"{first.name}: offset 348"):
        FileLogStore.open(tmp_path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX, verify_all=True)
    # Without verify_all only the last segment is verified on open; reads still check the CRC.
    store = FileLogStore.open(tmp_path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX)
    assert store.entries(1, 2, ALL_BYTES)[0].index == 1
    with pytest.raises(CorruptLogError, match="checksum"):
        store.entries(1, 3, ALL_BYTES)
    with pytest.raises(CorruptLogError):
        store.read_at(348)
    store.close()


def test_bad_checksum_mid_last_segment_is_named(tmp_path: Path) -> None:
    filled_store(tmp_path)
    last = data_files(tmp_path)[-1]
    flip_byte(last, 10)  # the first entry's header, two intact entries after it
    with pytest.raises(CorruptLogError, match=f"{last.name}: offset 0: .*not a torn write"):
        FileLogStore.open(tmp_path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX)


@pytest.mark.parametrize("damage", ["bad_last_checksum", "garbage_after_the_end"])
def test_damage_at_the_end_that_no_crash_leaves_is_corruption(tmp_path: Path, damage: str) -> None:
    """A crash keeps each sector whole or as it was (zeros past the end), or cuts the file: a
    flipped bit in the last entry, or garbage after it, is neither."""
    filled_store(tmp_path)
    last = data_files(tmp_path)[-1]
    size = last.stat().st_size
    if damage == "bad_last_checksum":
        flip_byte(last, size - 1)
    else:
        with open(last, "ab") as f:
            f.write(random.Random(7).randbytes(777).replace(b"\x12", b"\x13"))
    offset = size - 348 if damage == "bad_last_checksum" else size
    with pytest.raises(CorruptLogError, match=f"offset {offset}: .*not a torn write"):
        FileLogStore.open(tmp_path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX)


def test_a_zeroed_sector_that_a_later_entry_says_was_durable_is_corruption(
    tmp_path: Path,
) -> None:
    """Zeros look like a torn write, unless an intact entry written after they were fsynced
    follows: its frame records how far the log was durable."""
    store = FileLogStore.open(tmp_path)
    store.append(make_entries(1, 2, [1000] * 3))
    store.sync()
    store.append(make_entries(4, 2, [1000]))
    store.sync()
    store.close()
    with open(data_files(tmp_path)[0], "r+b") as f:
        f.seek(1536)  # inside entry 2 (1048..2096): one whole sector reads back as zeros
        f.write(bytes(512))
    with pytest.raises(CorruptLogError,
                       match=r"offset 1048: .*intact entry at offset 3144 .* durable to position 3144"):
        FileLogStore.open(tmp_path)


def test_a_hole_in_the_last_unsynced_window_is_a_torn_tail(tmp_path: Path) -> None:
    """Bytes written since the last fsync may reach the disk in any order, so a hole followed by
    intact entries that do not claim it durable is a torn tail: the log ends at the hole."""
    store = FileLogStore.open(tmp_path)
    synced = make_entries(1, 2, [300] * 2)
    store.append(synced)
    store.sync()
    store.append(make_entries(3, 2, [300] * 3))
    store.close()  # not synced: then entry 3's bytes "never reached the disk", 4 and 5 did
    with open(data_files(tmp_path)[0], "r+b") as f:
        f.seek(2 * 348)
        f.write(bytes(348))
    store = FileLogStore.open(tmp_path)
    assert all_entries(store) == synced
    store.close()
    assert data_files(tmp_path)[0].stat().st_size == 2 * 348


def test_a_size_field_running_past_the_end_mid_segment_is_corruption(tmp_path: Path) -> None:
    filled_store(tmp_path)
    last = data_files(tmp_path)[-1]
    flip_byte(last, 348 + 6)  # the second entry's size field: now far past the end
    with pytest.raises(CorruptLogError, match="offset 348"):
        FileLogStore.open(tmp_path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX)


def test_a_frame_found_at_the_wrong_position_is_corruption(tmp_path: Path) -> None:
    filled_store(tmp_path)
    files = data_files(tmp_path)
    files[1].write_bytes(files[0].read_bytes())  # same size, but entries of other positions
    with pytest.raises(CorruptLogError, match=f"{files[1].name}: offset 0: frame says position"):
        FileLogStore.open(tmp_path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX, verify_all=True)


def test_a_damaged_meta_file_is_named_and_a_leftover_temp_file_ignored(tmp_path: Path) -> None:
    filled_store(tmp_path)
    store = FileLogStore.open(tmp_path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX)
    assert store.retain_from(5) == 4
    store.close()
    (tmp_path / "meta.tmp").write_bytes(b"a crash left this")
    store = FileLogStore.open(tmp_path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX)
    assert (store.first_index(), store.term_at(3)) == (4, 2)
    store.close()
    assert not (tmp_path / "meta.tmp").exists()
    flip_byte(tmp_path / "meta", 12)
    with pytest.raises(CorruptLogError, match="meta"):
        FileLogStore.open(tmp_path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX)


def test_a_missing_middle_segment_is_corruption(tmp_path: Path) -> None:
    filled_store(tmp_path)
    data_files(tmp_path)[1].unlink()
    with pytest.raises(CorruptLogError, match="missing"):
        FileLogStore.open(tmp_path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX)


@pytest.mark.parametrize(
    "damage",
    ["cut_mid_body", "cut_mid_header", "zeros", "zeroed_sector"],
)
def test_a_torn_tail_is_cut_and_complete_entries_kept(tmp_path: Path, damage: str) -> None:
    entries = filled_store(tmp_path)
    last = data_files(tmp_path)[-1]
    size = last.stat().st_size
    with open(last, "r+b") as f:
        if damage == "cut_mid_body":
            f.truncate(size - 100)
        elif damage == "cut_mid_header":
            f.truncate(size - 348 + 20)
        elif damage == "zeros":
            f.seek(size)
            f.write(bytes(5000))
        elif damage == "zeroed_sector":  # the last entry (696..1044): its sector from 1024 lost
            f.seek(1024)
            f.write(bytes(20))
    kept = entries if damage == "zeros" else entries[:-1]
    store = FileLogStore.open(tmp_path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX)
    assert all_entries(store) == kept
    assert last.stat().st_size == sum(HEADER_BYTES + 300 for _ in range(len(kept) % 3 or 3))
    index_file = last.with_suffix(".index")
    assert index_file.stat().st_size == (len(kept) % 3 or 3) * INDEX_RECORD_BYTES
    more = make_entries(len(kept) + 1, 3, [50, 50])
    store.append(more)
    store.sync()
    store.close()
    store = FileLogStore.open(tmp_path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX, verify_all=True)
    assert all_entries(store) == kept + more
    store.close()


def test_damaged_or_missing_index_files_are_rebuilt(tmp_path: Path) -> None:
    entries = filled_store(tmp_path)
    indexes = sorted(tmp_path.glob("*.index"))
    indexes[0].unlink()
    indexes[1].write_bytes(indexes[1].read_bytes()[:30])
    flip_byte(indexes[2], 5)
    with open(indexes[-1], "ab") as f:
        f.write(bytes(24 * 3))
    store = FileLogStore.open(tmp_path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX)
    assert all_entries(store) == entries
    assert [store.position_of(i) for i in range(1, 13)] == [348 * k for k in range(12)]
    store.close()
    assert all(p.stat().st_size == 3 * INDEX_RECORD_BYTES for p in tmp_path.glob("*.index"))


def test_an_unsynced_truncation_is_not_undone_by_power_loss(tmp_path: Path) -> None:
    store = FileLogStore.open(tmp_path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX)
    store.append(make_entries(1, 1, [300] * 9))
    store.sync()
    store.append(make_entries(4, 2, [10]))  # conflicting suffix 4..9 cut, not synced
    assert store.power_loss(tear=False) == 58
    store = FileLogStore.open(tmp_path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX)
    assert store.last_index() == 3 and store.term_at(3) == 1
    store.close()


def test_a_torn_power_loss_keeps_a_prefix(tmp_path: Path) -> None:
    for seed in range(30):
        path = tmp_path / str(seed)
        store = FileLogStore.open(path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX)
        synced = make_entries(1, 1, [200] * 5)
        store.append(synced)
        store.sync()
        unsynced = make_entries(6, 1, [200] * 10, seed=1)
        store.append(unsynced)
        store.power_loss(random.Random(seed), tear=True)
        store = FileLogStore.open(path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX)
        got = all_entries(store)
        assert got == (synced + unsynced)[: len(got)] and len(got) >= 5
        store.close()


class _SectorCrashDisk:
    """A crash model that does not trust the store's bookkeeping: it watches the store's
    pwrite and fdatasync calls, and at a crash each 512-byte sector written since its file's
    last fdatasync goes back, with probability 1/2, to what it held before that write."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.before: dict[int, dict[int, bytes]] = {}  # fd -> sector -> bytes before
        self.full_after: int | None = None  # writes left before ENOSPC (None: never)
        self._pwrite, self._fdatasync, self._close = os.pwrite, os.fdatasync, os.close
        monkeypatch.setattr(commitlog.os, "pwrite", self.pwrite)
        monkeypatch.setattr(commitlog.os, "fdatasync", self.fdatasync)
        monkeypatch.setattr(commitlog.os, "close", self.close)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        if self.full_after is not None:
            self.full_after -= 1
            if self.full_after < 0:
                raise OSError(errno.ENOSPC, "No space left on device")
        dirty = self.before.setdefault(fd, {})
        for sector in range(offset // 512, (offset + len(data) + 511) // 512):
            if sector not in dirty:
                old = os.pread(fd, 512, sector * 512)
                dirty[sector] = old + bytes(512 - len(old))
        return self._pwrite(fd, data, offset)

    def fdatasync(self, fd: int) -> None:
        self._fdatasync(fd)
        self.before.pop(fd, None)

    def close(self, fd: int) -> None:  # a file closed (deleted, or sealed) is done with
        self._close(fd)
        self.before.pop(fd, None)  # and the number may name a new file next

    def crash(self, store: FileLogStore, rng: random.Random) -> None:
        for fd in [seg.data_fd for seg in store._segments]:
            for sector, old in sorted(self.before.get(fd, {}).items()):
                if rng.random() < 0.5:
                    self._pwrite(fd, old, sector * 512)
        store._release(tidy=False)


def test_a_crash_that_loses_unsynced_sectors_keeps_every_fsynced_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random appends (with conflicts and full disks), syncs and background syncs with appends
    while the fsync runs, then a crash of the model above: the reopened log is a prefix of what
    was written and holds every entry fsynced. A stamp that claimed bytes not yet fsynced, or a
    cut that let old entries back, would end in a refusal or a wrong log."""
    for seed in range(150):
        disk = _SectorCrashDisk(monkeypatch)
        rng = random.Random(seed)
        path, segment_bytes_max = tmp_path / str(seed), rng.choice([700, 1500, 5000, 1 << 20])
        store = FileLogStore.open(path, segment_bytes_max=segment_bytes_max)
        model: list[Entry] = []
        fsynced = 0  # how many of the model's entries were fsynced
        token: tuple[commitlog.SyncToken, int] | None = None
        for _ in range(rng.randint(5, 40)):
            op = rng.random()
            if op < 0.45:
                first = len(model) + 1
                if token is None and model and rng.random() < 0.3:
                    first = rng.randint(1, len(model))  # a conflict: the suffix is cut
                term = (model[first - 2].term if first > 1 else 1) + rng.randint(0, 1)
                sizes = [rng.randint(0, 600) for _ in range(rng.randint(1, 5))]
                batch = make_entries(first, term, sizes, seed=rng.randrange(1 << 30))
                disk.full_after = rng.randint(0, 3) if rng.random() < 0.15 else None
                try:
                    store.append(batch)
                    written = True
                except DiskFullError:
                    written = False
                disk.full_after = None
                if first <= len(model):  # the cut stays done even if the write failed
                    del model[first - 1 :]
                    fsynced = min(fsynced, first - 1)
                if written:
                    model += batch
            elif op < 0.6 and token is None:
                store.sync()
                fsynced = len(model)
            elif op < 0.8 and token is None:
                token = (store.sync_begin(), len(model))
                store.fsync_fds(token[0])
            elif token is not None:
                store.sync_end(token[0])
                fsynced = max(fsynced, token[1])
                token = None
        disk.crash(store, rng)
        monkeypatch.undo()
        store = FileLogStore.open(path, segment_bytes_max=segment_bytes_max)
        got = all_entries(store)
        store.close()
        assert got == model[: len(got)] and len(got) >= fsynced, f"seed {seed}"


def test_after_a_cut_the_file_runs_ahead_with_zeros_again(tmp_path: Path) -> None:
    """Entries land in zeros, so a flush commits no new file size: also after a truncation."""
    store = FileLogStore.open(tmp_path)
    store.append(make_entries(1, 1, [100] * 3))
    data = data_files(tmp_path)[0]
    assert data.stat().st_size == 3 * 148 + commitlog.ZERO_FILL_STEP_BYTES
    store.append(make_entries(2, 2, [100]))  # a conflict: entries 2 and 3 cut
    assert data.stat().st_size == 2 * 148 + commitlog.ZERO_FILL_STEP_BYTES
    store.close()
    assert data.stat().st_size == 2 * 148


def test_a_frame_claims_only_what_was_fsynced_before_it_was_written(tmp_path: Path) -> None:
    """Entries appended while a background sync runs claim the durable position from before it;
    after sync_end, the next ones claim what it covered."""
    store = FileLogStore.open(tmp_path)
    store.append(make_entries(1, 1, [100]))
    token = store.sync_begin()
    store.append(make_entries(2, 1, [100]))  # while the fsync "runs"
    store.fsync_fds(token)
    store.sync_end(token)
    store.append(make_entries(3, 1, [100]))
    store.close()
    buf = data_files(tmp_path)[0].read_bytes()
    claims = [int.from_bytes(buf[148 * k + 36 : 148 * k + 44], "little") for k in range(3)]
    assert claims == [0, 0, 148]
