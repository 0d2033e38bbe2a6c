"""The core's view of its log: durable entries (read through a LogReader) plus unstable entries
not yet handed to the shell for persistence, and the commit and applied indexes. Recently
persisted entries stay in a bounded cache so that replicating and applying them does not read
them back from disk, until they are applied and (on a leader) every peer holds them.

Owns log-matching logic (term lookups, conflict search, truncate-and-append) and the rule that
the commit index never moves backwards. Pure: the only reads go through the LogReader seam.
"""

from __future__ import annotations

from collections.abc import Sequence

from dledger.raft.types import Entry, EntryKind, LogReader, SnapshotMeta, entries_bytes

_RELEASED = Entry(0, 0, EntryKind.NOOP, b"")  # a cache slot before the cache's head


class RaftLog:
    def __init__(self, stable: LogReader, applied_index: int = 0,
                 cache_bytes_max: int = 32 << 20) -> None:
        self.stable = stable
        # Persisted entries _cache[_cache_head:], ending at unstable_offset - 1. A list with a
        # moving head (compacted now and then) so that slicing costs only what it returns.
        self._cache: list[Entry] = []
        self._cache_head = 0
        self.cache_bytes = 0
        self.cache_bytes_max = cache_bytes_max
        self.unstable: list[Entry] = []
        self.unstable_offset = stable.last_index() + 1  # index of unstable[0]
        if applied_index > stable.last_index():
            raise ValueError(f"applied index {applied_index} is past the log's last index "
                             f"{stable.last_index()}: the state machine is ahead of its log")
        floor = stable.first_index() - 1  # retained-away entries were committed and applied
        self.applied_index = max(applied_index, floor)
        self.commit_index = self.applied_index
        self.handed_out_index = self.applied_index  # committed entries given to the shell
        # A snapshot restored but not yet installed by the shell: until then the stable log is
        # not read (it is about to be replaced) and the log begins right after the snapshot.
        self.pending_snapshot: SnapshotMeta | None = None
        self.snapshot_handed_out = False

    # -- indexes -------------------------------------------------------------------------

    def first_index(self) -> int:
        if self.pending_snapshot is not None:
            return self.pending_snapshot.index + 1
        return self.stable.first_index()

    def last_index(self) -> int:
        if self.unstable:
            return self.unstable_offset + len(self.unstable) - 1
        if self.pending_snapshot is not None:
            return self.pending_snapshot.index
        return self.stable.last_index()

    def last_term(self) -> int:
        return self.term_at(self.last_index())

    def persisted_index(self) -> int:
        """Last index that is durable (written by the shell) and still part of this log."""
        if self.pending_snapshot is not None:
            return self.pending_snapshot.index if self.snapshot_handed_out else 0
        return min(self.stable.last_index(), self.unstable_offset - 1)

    # -- terms ---------------------------------------------------------------------------

    def term_at(self, index: int) -> int:
        """Term at index; raises IndexError past the end or below first_index() - 1."""
        if index >= self.unstable_offset and self.unstable:
            k = index - self.unstable_offset
            if k >= len(self.unstable):
                raise IndexError(f"index {index} past last index {self.last_index()}")
            return self.unstable[k].term
        snap = self.pending_snapshot
        if snap is not None:
            if index == snap.index:
                return snap.term
            raise IndexError(f"index {index} is not held past the snapshot at {snap.index}")
        if index > self.stable.last_index():
            raise IndexError(f"index {index} past last index {self.last_index()}")
        return self.stable.term_at(index)

    def match_term(self, index: int, term: int) -> bool:
        if index < self.first_index() - 1:
            return True  # retained away: committed, so it matches every later leader's log
        if index > self.last_index():
            return False
        return self.term_at(index) == term

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Raft 5.4.1: the candidate's log is at least as up-to-date as ours."""
        my_term = self.last_term()
        return last_term > my_term or (last_term == my_term and last_index >= self.last_index())

    def last_index_with_term_at_most(self, hi: int, term: int) -> int:
        """Largest index <= hi whose term is <= term (terms never decrease along the log),
        or first_index() - 1 if there is none. Used by fast back-tracking on both sides."""
        lo = self.first_index() - 1
        hi = min(hi, self.last_index())
        if hi <= lo or self.term_at(hi) <= term:
            return max(hi, lo)
        # invariant: term_at(lo) <= term (or lo is the floor), term_at(hi) > term
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.term_at(mid) <= term:
                lo = mid
            else:
                hi = mid
        return lo

    # -- reads ---------------------------------------------------------------------------

    def slice(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries [lo, hi), at least one if lo < hi, within max_bytes."""
        out: list[Entry] = []
        offset = self.unstable_offset
        if lo >= offset:  # only unstable entries (a leader's fresh proposals)
            _take(self.unstable[lo - offset : max(lo, hi) - offset], out, 0, max_bytes)
            return out
        hi = min(hi, self.last_index() + 1)
        if lo >= hi:
            return out
        stable_hi = min(hi, self.unstable_offset)
        cache_lo = self.unstable_offset - (len(self._cache) - self._cache_head)
        disk_hi = min(stable_hi, cache_lo)
        if lo < disk_hi:
            out.extend(self.stable.entries(lo, disk_hi, max_bytes))
            if len(out) < disk_hi - lo:
                return out
        size = sum(e.size_bytes for e in out)
        if stable_hi > max(lo, cache_lo):
            base = self._cache_head - cache_lo
            size = _take(self._cache[base + max(lo, cache_lo) : base + stable_hi], out, size,
                         max_bytes)
            if out and out[-1].index < stable_hi - 1:
                return out
        if hi > self.unstable_offset:
            start = max(lo, self.unstable_offset) - self.unstable_offset
            _take(self.unstable[start : hi - self.unstable_offset], out, size, max_bytes)
        return out

    def next_committed(self, max_bytes: int) -> list[Entry]:
        """Committed entries not yet handed out for applying."""
        return self.slice(self.handed_out_index + 1, self.commit_index + 1, max_bytes)

    # -- writes --------------------------------------------------------------------------

    def append(self, entries: Sequence[Entry]) -> None:
        """Truncate after entries[0].index - 1 and append (the new entries become unstable)."""
        if not entries:
            return
        after = entries[0].index - 1
        if after == self.last_index():
            if not self.unstable:
                self.unstable_offset = after + 1
            self.unstable.extend(entries)
        elif after < self.unstable_offset:
            self.unstable = list(entries)
            self.unstable_offset = after + 1
            while len(self._cache) > self._cache_head and self._cache[-1].index > after:
                self.cache_bytes -= self._cache.pop().size_bytes
        else:
            del self.unstable[after + 1 - self.unstable_offset :]
            self.unstable.extend(entries)

    def find_conflict(self, entries: Sequence[Entry]) -> int:
        """Index of the first entry that is new or disagrees with our log; 0 if all match."""
        for e in entries:
            if not self.match_term(e.index, e.term):
                return e.index
        return 0

    def commit_to(self, index: int) -> bool:
        """Raise the commit index (never lowers it). Returns True if it moved."""
        if index <= self.commit_index:
            return False
        assert index <= self.last_index(), (index, self.last_index())
        self.commit_index = index
        return True

    def stable_to(self, last_persisted: int) -> None:
        """The shell persisted every unstable entry up to last_persisted."""
        if not self.unstable or last_persisted < self.unstable_offset:
            return
        drop = last_persisted - self.unstable_offset + 1
        cache = self._cache
        persisted = self.unstable[:drop]
        cache.extend(persisted)
        self.cache_bytes += entries_bytes(persisted)
        while self._cache_head < len(cache) and self.cache_bytes > self.cache_bytes_max:
            self._release_head()
        self._compact_cache()
        del self.unstable[:drop]
        self.unstable_offset = last_persisted + 1

    def release_cache_to(self, index: int) -> None:
        """Nobody reads entries up to ``index`` soon (they are applied here and, on a leader, every
        peer holds them): they leave the cache, and a later read of one goes to the stable log.
        At rest the cache is then empty; its bound counts only for a peer that lags."""
        cache = self._cache
        if self._cache_head < len(cache) and cache[self._cache_head].index <= index:
            while self._cache_head < len(cache) and cache[self._cache_head].index <= index:
                self._release_head()
            self._compact_cache()

    def _release_head(self) -> None:
        self.cache_bytes -= self._cache[self._cache_head].size_bytes
        self._cache[self._cache_head] = _RELEASED  # (its data is not held until the compaction)
        self._cache_head += 1

    def _compact_cache(self) -> None:
        if self._cache_head > 1024 and self._cache_head * 2 > len(self._cache):
            del self._cache[: self._cache_head]
            self._cache_head = 0

    def applied_to(self, index: int) -> None:
        if index > self.applied_index:
            self.applied_index = index

    # -- snapshots ------------------------------------------------------------------------

    def restore(self, meta: SnapshotMeta) -> None:
        """Replace the whole log with a snapshot of ``meta.index``: every entry up to there is
        committed and applied (by the snapshot), nothing after it is held. The shell installs the
        snapshot when it is handed out in a Ready; ``snapshot_installed`` follows its advance."""
        self.pending_snapshot = meta
        self.snapshot_handed_out = False
        self.unstable = []
        self.unstable_offset = meta.index + 1
        self._cache = []
        self._cache_head = 0
        self.cache_bytes = 0
        self.commit_index = self.applied_index = self.handed_out_index = meta.index

    def snapshot_installed(self) -> None:
        """The shell installed the pending snapshot: its log store now begins after it (or at
        older entries the snapshot brought along, all committed), and is read again."""
        self.pending_snapshot = None
        self.snapshot_handed_out = False


def _take(entries: Sequence[Entry], out: list[Entry], size: int,
          max_bytes: int) -> int:
    """Append entries to out while within max_bytes (at least one overall); returns the size."""
    total = size + entries_bytes(entries)
    if total <= max_bytes:  # (the common case: all of them, in one extend)
        out.extend(entries)
        return total
    for e in entries:
        size += e.size_bytes
        if out and size > max_bytes:
            break
        out.append(e)
    return size
