"""What the commitlog tests share: entries of given sizes, the store's data files and entries,
a model cut to a prefix, a flipped byte, and a store filled across several small segments."""

from __future__ import annotations

import random
from pathlib import Path

from dledger.raft.types import Entry, EntryKind
from dledger.storage.commitlog import FileLogStore
from dledger.storage.memstore import MemoryLogStore

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


FILL_SEGMENT_BYTES_MAX = 1100  # three 348-byte frames per data file


def filled_store(path: Path, count: int = 12, size: int = 300) -> list[Entry]:
    """``count`` entries of ``size`` bytes (348-byte frames), synced and closed, 3 per file."""
    store = FileLogStore.open(path, segment_bytes_max=FILL_SEGMENT_BYTES_MAX)
    entries = make_entries(1, 2, [size] * count)
    store.append(entries)
    store.sync()
    store.close()
    return entries
