"""The file-backed commitlog (``dledger.storage.commitlog.FileLogStore``).

A stateful property test runs random appends, suffix truncations, syncs, retention, reopens,
process crashes and power losses against the in-memory model (``dledger.storage.memstore.MemoryLogStore``);
example tests cover corruption, torn tails, positions, reads by position, a full disk and the
append cost.
"""

from __future__ import annotations

import errno
import os
import random
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from dledger.storage import commitlog
from dledger.storage.commitlog import FileLogStore
from dledger.storage.entry_codec import HEADER_BYTES, INDEX_RECORD_BYTES
from protocol.errors import CompactedError, CorruptLogError, DiskFullError, StorageError
from dledger.storage.memstore import ENTRY_HEADER_BYTES, MemoryLogStore
from dledger.raft.types import Entry, EntryKind

SEGMENT_BYTES_MAX = 4096
ALL_BYTES = 1 << 40


def make_entries(first: int, term: int, sizes: list[int], seed: int = 0) -> list[Entry]:
    rng = random.Random(seed)
    return [
        Entry(first + k, term, EntryKind(rng.randint(0, 1)), rng.randbytes(size))
        for k, size in enumerate(sizes)
    ]


def data_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.data"))


def all_entries(store: FileLogStore) -> list[Entry]:
    return list(store.entries(store.first_index(), store.last_index() + 1, ALL_BYTES))


def prefix_model(model: MemoryLogStore, last_index: int) -> MemoryLogStore:
    """A synced model holding ``model``'s entries up to ``last_index``."""
    keep = last_index - model.base_index
    prefix = MemoryLogStore(
        base_index=model.base_index,
        base_term=model.base_term,
        base_position=model.base_position,
        entries_list=model.entries_list[:keep],
        positions=model.positions[:keep],
    )
    prefix.sync()
    return prefix


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x5A]))


def test_header_size_matches_the_model() -> None:
    assert HEADER_BYTES == ENTRY_HEADER_BYTES == 48


# --- the stateful property test ---------------------------------------------------------------

batch_sizes = st.lists(st.one_of(st.integers(0, 200), st.integers(0, 3000)), min_size=1, max_size=6)


def kill_without_close(store: FileLogStore) -> None:
    """Release the store's files the way a killed process does: no writes on the way out."""
    for seg in store._segments:
        os.close(seg.data_fd)
        os.close(seg.index_fd)
    os.close(store._dir_fd)
    store._closed = True


class LogMachine(RuleBasedStateMachine):
    """The file store and the model must show the same log after every step."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.path = tempfile.mkdtemp(dir=root)
        self.store = FileLogStore.open(self.path, segment_bytes_max=SEGMENT_BYTES_MAX)
        self.model = MemoryLogStore()
        # Every entry up to this index survives a power loss: the last index at the last sync,
        # lowered by any truncation since (truncation is durable at once).
        self.floor_index = 0

    def teardown(self) -> None:
        self.store.close()

    def _append_at(self, index: int, sizes: list[int], term_bump: int, seed: int) -> None:
        term = self.model.term_at(index - 1) + term_bump
        batch = make_entries(index, max(term, 1), sizes, seed)
        if index <= self.model.last_index():
            self.floor_index = min(self.floor_index, index - 1)
        self.store.append(batch)
        self.model.append(batch)

    @rule(sizes=batch_sizes, term_bump=st.integers(0, 1), seed=st.integers(0, 99))
    def append_batch(self, sizes: list[int], term_bump: int, seed: int) -> None:
        self._append_at(self.model.last_index() + 1, sizes, term_bump, seed)

    @precondition(lambda self: self.model.last_index() >= self.model.first_index())
    @rule(data=st.data(), sizes=batch_sizes, term_bump=st.integers(0, 2), seed=st.integers(0, 99))
    def truncate_suffix(
        self, data: st.DataObject, sizes: list[int], term_bump: int, seed: int
    ) -> None:
        index = data.draw(st.integers(self.model.first_index(), self.model.last_index()))
        self._append_at(index, sizes, term_bump, seed)

    @rule()
    def sync(self) -> None:
        self.store.sync()
        self.model.sync()
        self.floor_index = self.model.last_index()

    @rule(data=st.data())
    def retain(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(self.model.first_index(), self.model.last_index() + 1))
        old_first = self.store.first_index()
        first = self.store.retain_from(index)
        assert old_first <= first <= index
        self.model.retain_from(first)

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = FileLogStore.open(self.path, segment_bytes_max=SEGMENT_BYTES_MAX)
        self.model.sync()  # open makes what it recovered durable
        self.floor_index = self.model.last_index()

    @rule()
    def process_crash(self) -> None:
        # SIGKILL: what was written stays in the page cache; what only the process held (index
        # records not yet written) is gone, and open rebuilds them from the data.
        kill_without_close(self.store)
        self.store = FileLogStore.open(self.path, segment_bytes_max=SEGMENT_BYTES_MAX)
        self.model.sync()
        self.floor_index = self.model.last_index()

    @rule(tear=st.booleans(), seed=st.integers(0, 2**16), verify_all=st.booleans())
    def power_loss(self, tear: bool, seed: int, verify_all: bool) -> None:
        floor_index = max(self.floor_index, self.model.base_index)
        last_before = self.model.last_index()
        self.store.power_loss(random.Random(seed), tear=tear)
        self.store = FileLogStore.open(
            self.path, segment_bytes_max=SEGMENT_BYTES_MAX, verify_all=verify_all
        )
        last = self.store.last_index()
        assert floor_index <= last <= last_before, (floor_index, last, last_before)
        if tear:  # some unsynced entries may survive, all intact: a prefix of the log before
            self.model = prefix_model(self.model, last)
        else:
            assert last == floor_index
            self.model.power_loss(keep_ops=0)
            self.model = prefix_model(self.model, min(self.model.last_index(), floor_index))
        self.floor_index = last

    @precondition(lambda self: self.model.last_index() >= self.model.first_index())
    @rule(data=st.data(), max_bytes=st.integers(0, 8000))
    def read_some(self, data: st.DataObject, max_bytes: int) -> None:
        lo = data.draw(st.integers(self.model.first_index(), self.model.last_index()))
        hi = data.draw(st.integers(lo, self.model.last_index() + 2))
        expected = list(self.model.entries(lo, hi, max_bytes))
        assert list(self.store.entries(lo, hi, max_bytes)) == expected
        entry = self.model.entries_list[lo - self.model.first_index()]
        assert self.store.read_at(self.store.position_of(lo)) == entry

    @invariant()
    def same_log(self) -> None:
        store, model = self.store, self.model
        assert store.first_index() == model.first_index()
        assert store.last_index() == model.last_index()
        assert store.end_position() == model.end_position()
        held = range(model.first_index(), model.last_index() + 1)
        with_base = range(model.first_index() - 1, model.last_index() + 1)
        assert [store.term_at(i) for i in with_base] == [model.term_at(i) for i in with_base]
        assert [store.position_of(i) for i in held] == [model.position_of(i) for i in held]
        assert all_entries(store) == model.entries_list


def test_file_store_behaves_as_the_model(tmp_path: Path) -> None:
    run_state_machine_as_test(
        lambda: LogMachine(tmp_path),
        settings=settings(
            max_examples=300,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        ),
    )


# --- positions and reads ------------------------------------------------------------------------


def test_positions_are_the_same_whatever_the_segment_size(tmp_path: Path) -> None:
    entries = make_entries(1, 1, [random.Random(k).randint(0, 2500) for k in range(60)])
    small = FileLogStore.open(tmp_path / "small", segment_bytes_max=1024)
    large = FileLogStore.open(tmp_path / "large", segment_bytes_max=1 << 20)
    model = MemoryLogStore()
    for k in range(0, 60, 7):
        for store in (small, large, model):
            store.append(entries[k : k + 7])
    positions = [model.position_of(i) for i in range(1, 61)]
    assert [small.position_of(i) for i in range(1, 61)] == positions
    assert [large.position_of(i) for i in range(1, 61)] == positions
    assert positions == [sum(HEADER_BYTES + len(e.data) for e in entries[:k]) for k in range(60)]
    assert len(data_files(tmp_path / "small")) > 10 and len(data_files(tmp_path / "large")) == 1
    small.close()
    large.close()


def test_data_files_are_named_by_their_first_position(tmp_path: Path) -> None:
    store = FileLogStore.open(tmp_path, segment_bytes_max=1024)
    store.append(make_entries(1, 1, [400] * 10))
    expected = sorted({store.position_of(i) for i in range(1, 11) if (i - 1) % 2 == 0})
    assert [p.name for p in data_files(tmp_path)] == [f"{pos:020d}.data" for pos in expected]
    store.close()


def test_read_at_position_of_returns_the_entry(tmp_path: Path) -> None:
    store = FileLogStore.open(tmp_path, segment_bytes_max=2048)
    entries = make_entries(1, 3, [0, 10, 3000, 500, 1, 2047])
    store.append(entries)
    for entry in entries:
        assert store.read_at(store.position_of(entry.index)) == entry
    with pytest.raises(IndexError):
        store.read_at(store.position_of(2) + 1)
    with pytest.raises(IndexError):
        store.read_at(store.end_position())
    store.append(make_entries(7, 3, [3000, 3000]))
    store.sync()
    assert store.retain_from(8) > 1
    with pytest.raises(CompactedError):
        store.read_at(0)
    with pytest.raises(CompactedError):
        store.entries(1, 3, ALL_BYTES)
    store.close()


def test_an_entry_bigger_than_a_segment_gets_its_own(tmp_path: Path) -> None:
    store = FileLogStore.open(tmp_path, segment_bytes_max=1024)
    store.append(make_entries(1, 1, [100, 5000, 100]))
    sizes = [p.stat().st_size for p in data_files(tmp_path)]
    assert sizes == [148, 5048, 1024]  # sealed ones cut to their entries, the last zero-filled
    store.close()
    assert [p.stat().st_size for p in data_files(tmp_path)] == [148, 5048, 148]


def test_term_before_first_index_survives_reopen(tmp_path: Path) -> None:
    store = FileLogStore.open(tmp_path, segment_bytes_max=1024)
    for term in range(1, 6):
        store.append(make_entries(store.last_index() + 1, term, [900]))
    store.sync()
    assert store.retain_from(4) == 4
    assert store.term_at(3) == 3
    with pytest.raises(CompactedError):
        store.term_at(2)
    store.close()
    store = FileLogStore.open(tmp_path, segment_bytes_max=1024)
    assert (store.first_index(), store.last_index(), store.term_at(3)) == (4, 5, 3)
    assert store.retain_from(100) == 5  # never the segment holding the last entry
    assert len(data_files(tmp_path)) == 1
    store.close()


def test_open_finishes_an_interrupted_retention(tmp_path: Path) -> None:
    store = FileLogStore.open(tmp_path, segment_bytes_max=1024)
    store.append(make_entries(1, 1, [900] * 4))
    store.sync()
    saved = {p: p.read_bytes() for p in tmp_path.glob("0*")}
    store.retain_from(3)
    store.close()
    for path, content in saved.items():  # as if the crash came before the deletes
        path.write_bytes(content)
    store = FileLogStore.open(tmp_path, segment_bytes_max=1024)
    assert (store.first_index(), store.last_index()) == (3, 4)
    assert len(data_files(tmp_path)) == 2
    store.close()


def test_a_second_open_of_the_same_directory_is_refused(tmp_path: Path) -> None:
    store = FileLogStore.open(tmp_path)
    with pytest.raises(StorageError):
        FileLogStore.open(tmp_path)
    store.close()
    FileLogStore.open(tmp_path).close()


# --- corruption and torn tails ----------------------------------------------------------------


FILL_SEGMENT_BYTES_MAX = 1100  # three 348-byte frames per data file


def filled_store(path: Path, count: int = 12, size: int = 300) -> list[Entry]:
    """``count`` entries of ``size`` bytes (348-byte frames), synced and closed, 3 per file."""
    store = FileLogStore.open(path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX)
    entries = make_entries(1, 2, [size] * count)
    store.append(entries)
    store.sync()
    store.close()
    return entries


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
                       match="offset 1048: .*intact entry at offset 3144 .* durable to position 3144"):
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


# --- a full disk ---------------------------------------------------------------------------------


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


# --- cost ---------------------------------------------------------------------------------------


def test_append_and_term_at_are_cheap(tmp_path: Path) -> None:
    store = FileLogStore.open(tmp_path)
    entries = make_entries(1, 1, [128] * 1024)
    cpu_s = time.process_time()
    for k in range(0, 1024, 64):
        store.append(entries[k : k + 64])
        store.sync()
    per_batch_ms = (time.process_time() - cpu_s) * 1000 / 16
    cpu_s = time.process_time()
    for i in range(1, 1025):
        store.term_at(i)
    term_at_us = (time.process_time() - cpu_s) * 1e6 / 1024
    store.close()
    print(f"append+sync of 64 x 128 B: {per_batch_ms:.2f} ms CPU; term_at {term_at_us:.2f} us")
    assert per_batch_ms < 20 and term_at_us < 20


def test_positions_of_a_range_are_its_entries_positions_and_a_range_not_held_is_refused(
        tmp_path: Path) -> None:
    file_store = FileLogStore.open(tmp_path / "log", segment_bytes_max=4096)
    stores = [file_store, MemoryLogStore()]
    entries = [Entry(i, 1, EntryKind.NORMAL, b"x" * (i * 37 % 300)) for i in range(1, 41)]
    for store in stores:
        store.append(entries)  # (several segments of the file store)
        assert list(store.positions_of(1, 40)) == [store.position_of(i) for i in range(1, 41)]
        assert list(store.positions_of(7, 7)) == [store.position_of(7)]
        assert list(store.positions_of(9, 8)) == []
        for lo, hi in ((0, 3), (39, 41)):
            with pytest.raises(IndexError):
                store.positions_of(lo, hi)
    file_store.close()
