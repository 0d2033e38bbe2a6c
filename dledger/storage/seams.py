"""The storage seams of a node: the log store and the hard-state store, as protocols.

Owns only the contracts; the file-backed implementations live in ``commitlog`` and ``hardstate``,
the in-memory ones (used by tests and the simulator) in ``memstore``. A node
(``dledger.node.runtime.Node``) runs on any of them: it is given its stores, or opens the files.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from dledger.raft.types import Entry, HardState


def slice_positions(positions: Sequence[int], base_index: int, lo: int, hi: int) -> Sequence[int]:
    """``positions_of`` of a store that keeps the position of entry ``base_index + 1 + k`` at
    ``positions[k]``: one slice; IndexError unless every index in lo..hi is held."""
    if lo > hi:
        return []
    k_lo, k_hi = lo - base_index - 1, hi - base_index
    if not 0 <= k_lo < k_hi <= len(positions):
        raise IndexError(f"indexes {lo}..{hi} not held ({base_index + 1}..{base_index + len(positions)})")
    return positions[k_lo:k_hi]


class LogStore(Protocol):
    """A durable, ordered log of Raft entries, 1-based and contiguous from first_index().

    Contract:
    - ``append(entries)``: entries are contiguous; if ``entries[0].index <= last_index()`` the
      stored suffix from that index is truncated first. ``entries[0].index`` is never below
      ``first_index()`` and never above ``last_index() + 1``. Written bytes may sit in the page
      cache until ``sync()``.
    - ``sync()``: everything appended so far is durable when it returns (one fsync per batch).
    - ``term_at(first_index() - 1)`` is answered too (the term of the last retained-away entry,
      0 when nothing was ever retained away), so replication can start at first_index().
    - ``retain_from(index)``: may delete whole segments holding only entries below ``index``;
      returns the new first_index() (which is <= index).
    - ``position_of(index)``: the byte position of the entry in the logical commitlog, the same
      on every replica that holds the same entries; ``positions_of(lo, hi)`` those of lo..hi;
      ``read_at(position)`` the entry that starts there (``CompactedError`` if retained away,
      ``IndexError`` if no entry starts there).
    """

    def first_index(self) -> int: ...

    def last_index(self) -> int: ...

    def term_at(self, index: int) -> int: ...

    def entries(self, lo: int, hi: int, max_bytes: int) -> Sequence[Entry]: ...

    def append(self, entries: Sequence[Entry]) -> None: ...

    def sync(self) -> None: ...

    def position_of(self, index: int) -> int: ...

    def positions_of(self, lo: int, hi: int) -> Sequence[int]: ...

    def read_at(self, position: int) -> Entry: ...

    def retain_from(self, index: int) -> int: ...

    def close(self) -> None: ...


class HardStateStore(Protocol):
    """Term and vote; ``save`` returns only once the new state is durable."""

    def load(self) -> HardState: ...

    def save(self, state: HardState) -> None: ...
