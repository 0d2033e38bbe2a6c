"""In-memory log and hard-state stores with a model of durability.

Used by unit tests and the deterministic simulator in place of the file stores. The log store
remembers what was durable at the last ``sync()`` and every operation since, so a simulated power
loss can keep any prefix of the unsynced operations (the page cache wrote some back, in order) and
discard the rest, exactly what a real disk may do. Positions are computed as the file store does
(each entry's encoded size), so tests can compare the two.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from dledger.raft.types import Entry, HardState
from dledger.storage.seams import slice_positions
from protocol.errors import CompactedError

# Same per-entry overhead the file store's header has; only used to model positions.
ENTRY_HEADER_BYTES = 48


def encoded_size(entry: Entry) -> int:
    return ENTRY_HEADER_BYTES + len(entry.data)


@dataclass
class _Op:
    truncate_from: int  # index from which the log was cut before appending
    entries: tuple[Entry, ...]


@dataclass
class MemoryLogStore:
    """A ``LogStore`` in memory. ``entries_list[k]`` holds index ``base_index + 1 + k``."""

    base_index: int = 0  # index of the last retained-away entry (0: none)
    base_term: int = 0
    base_position: int = 0  # position of the first entry held
    entries_list: list[Entry] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    _durable: list[Entry] = field(default_factory=list)
    _unsynced: list[_Op] = field(default_factory=list)
    sync_count: int = 0

    # -- reads ---------------------------------------------------------------------------

    def first_index(self) -> int:
        return self.base_index + 1

    def last_index(self) -> int:
        return self.base_index + len(self.entries_list)

    def term_at(self, index: int) -> int:
        if index == self.base_index:
            return self.base_term
        if index < self.base_index:
            raise CompactedError(f"index {index} retained away (first index {self.first_index()})")
        if index > self.last_index():
            raise IndexError(f"index {index} past last index {self.last_index()}")
        return self.entries_list[index - self.base_index - 1].term

    def entries(self, lo: int, hi: int, max_bytes: int) -> Sequence[Entry]:
        if lo <= self.base_index:
            raise CompactedError(f"index {lo} retained away (first index {self.first_index()})")
        hi = min(hi, self.last_index() + 1)
        out: list[Entry] = []
        size = 0
        for k in range(lo - self.base_index - 1, hi - self.base_index - 1):
            e = self.entries_list[k]
            size += e.size_bytes
            if out and size > max_bytes:
                break
            out.append(e)
        return out

    def position_of(self, index: int) -> int:
        if index <= self.base_index or index > self.last_index():
            raise IndexError(f"index {index} not held")
        return self.positions[index - self.base_index - 1]

    def positions_of(self, lo: int, hi: int) -> Sequence[int]:
        return slice_positions(self.positions, self.base_index, lo, hi)

    def read_at(self, position: int) -> Entry:
        if position < self.base_position:
            raise CompactedError(f"position {position} retained away (log starts at "
                                 f"{self.base_position})")
        k = bisect.bisect_left(self.positions, position)
        if k == len(self.positions) or self.positions[k] != position:
            raise IndexError(f"no entry starts at position {position}")
        return self.entries_list[k]

    def end_position(self) -> int:
        if not self.entries_list:
            return self.base_position
        return self.positions[-1] + encoded_size(self.entries_list[-1])

    # -- writes --------------------------------------------------------------------------

    def append(self, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        first = entries[0].index
        assert self.first_index() <= first <= self.last_index() + 1, (first, self.last_index())
        self._cut(first)
        self._extend(entries)
        self._unsynced.append(_Op(first, tuple(entries)))

    def _cut(self, first: int) -> None:
        keep = first - self.base_index - 1
        del self.entries_list[keep:]
        del self.positions[keep:]

    def _extend(self, entries: Sequence[Entry]) -> None:
        pos = self.end_position()
        for e in entries:
            assert e.index == self.last_index() + 1
            self.entries_list.append(e)
            self.positions.append(pos)
            pos += encoded_size(e)

    def sync(self) -> None:
        self.sync_count += 1
        self._durable = list(self.entries_list)
        self._unsynced.clear()

    def sync_prefix(self, index: int) -> None:
        """A background fsync that began when the log ended at ``index`` has completed: what
        was written up to there is durable (later writes are not covered). The caller ensures
        nothing up to ``index`` was rewritten since (the core's write generation)."""
        keep = min(index, self.last_index()) - self.base_index
        if keep > len(self._durable):
            self._durable = self.entries_list[:keep]
        # Operations wholly inside the durable prefix are no longer "since the last sync".
        self._unsynced = [op for op in self._unsynced
                          if not op.entries or op.entries[-1].index > index]

    def retain_from(self, index: int) -> int:
        index = min(index, self.last_index() + 1)
        drop = index - self.base_index - 1
        if drop <= 0:
            return self.first_index()
        self.base_term = self.entries_list[drop - 1].term
        self.base_position = self.positions[drop] if drop < len(self.positions) else self.end_position()
        self.base_index += drop
        del self.entries_list[:drop]
        del self.positions[:drop]
        self._durable = self._durable[drop:] if len(self._durable) >= drop else []
        return self.first_index()

    def reset_to(self, index: int, term: int) -> None:
        """Install a snapshot of ``index`` (of ``term``): every entry is dropped, the log
        continues at index + 1; durable at once (as the file store's install)."""
        if self.base_index <= index < self.last_index():
            self.base_position = self.positions[index - self.base_index]
        elif index == self.last_index():
            self.base_position = self.end_position()
        self.base_index, self.base_term = index, term
        self.entries_list, self.positions = [], []
        self._durable, self._unsynced = [], []

    def close(self) -> None:
        return None

    # -- durability view (for the simulator's observer) --------------------------------------

    def durable_last_index(self) -> int:
        return self.base_index + len(self._durable)

    def durable_term_at(self, index: int) -> int | None:
        """Term of the entry at index in what would survive a power loss right now."""
        k = index - self.base_index - 1
        if k < 0 or k >= len(self._durable):
            return None
        return self._durable[k].term

    # -- test-only faults ------------------------------------------------------------------

    def power_loss(self, rng: random.Random | None = None, keep_ops: int | None = None) -> int:
        """Discard what was written since the last ``sync()``.

        With ``rng`` (and no ``keep_ops``) a random prefix of the unsynced operations survives,
        and the last surviving batch may itself be torn to a prefix of its entries. Returns the
        number of entries that were lost from the visible log.
        """
        before = self.last_index()
        ops = self._unsynced
        if keep_ops is None:
            keep_ops = rng.randint(0, len(ops)) if rng is not None and ops else 0
        self.entries_list = list(self._durable)
        self._rebuild_positions()
        survivors = ops[:keep_ops]
        for i, op in enumerate(survivors):
            entries = op.entries
            if rng is not None and i == len(survivors) - 1:
                entries = entries[: rng.randint(0, len(entries))]  # torn last write
            if op.truncate_from <= self.last_index() + 1 and entries:
                self._cut(op.truncate_from)
                self._extend(entries)
        self._durable = list(self.entries_list)
        self._unsynced = []
        return max(0, before - self.last_index())

    def _rebuild_positions(self) -> None:
        self.positions = []
        pos = self.base_position
        for e in self.entries_list:
            self.positions.append(pos)
            pos += encoded_size(e)


@dataclass
class MemoryHardStateStore:
    """A ``HardStateStore`` in memory; ``save`` is durable at once (as the file store's rename)."""

    state: HardState = field(default_factory=HardState)
    save_count: int = 0

    def load(self) -> HardState:
        return self.state

    def save(self, state: HardState) -> None:
        self.save_count += 1
        self.state = state
