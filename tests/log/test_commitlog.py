"""The file-backed commitlog (``dledger.storage.commitlog.FileLogStore``): a stateful property
test runs random appends, suffix truncations, syncs, retention, reopens, process crashes and
power losses against the in-memory model (``dledger.storage.memstore.MemoryLogStore``); examples
cover positions, reads by position and the append cost. Damage is tested in
test_commitlog_damage.py, a full disk in test_commitlog_full_disk.py."""

from __future__ import annotations

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

from dledger.raft.types import Entry, EntryKind
from dledger.storage.commitlog import FileLogStore
from dledger.storage.entry_codec import HEADER_BYTES
from dledger.storage.memstore import ENTRY_HEADER_BYTES, MemoryLogStore
from protocol.errors import CompactedError, StorageError
from tests.log.commitlog_files import (
    ALL_BYTES,
    SEGMENT_BYTES_MAX,
    all_entries,
    data_files,
    make_entries,
    prefix_model,
)


def test_header_size_matches_the_model() -> None:
    assert HEADER_BYTES == ENTRY_HEADER_BYTES == 48


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
