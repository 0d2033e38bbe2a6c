"""The dedup table of unique keys: which retried sends were stored already, and where.

unique key -> (topic, queue id, queue offset, store time), kept in insertion order and forgotten
from the oldest end: past the window (by the entries' store times, never a local clock) or past
the entry count bound. Part of the broker's state machine, so it is deterministic and identical on
every replica.

It is held in columns (keys, topics, and the numbers packed 20 bytes a row in one ``bytearray``)
rather than as an object per key, because a checkpoint must copy it without stalling the loop:
a million keys snapshot in a few list slices and one byte copy.
"""

from __future__ import annotations

import struct
from typing import Any

ROW = struct.Struct("<IQQ")  # queue id, queue offset, store time (ms)
ROW_BYTES = ROW.size
COMPACT_MIN = 4096  # forgotten rows are dropped from the columns in chunks at least this large


class DedupTable:
    __slots__ = ("window_ms", "max_entries", "_keys", "_topics", "_rows", "_base", "_head", "_index")

    def __init__(self, window_ms: int, max_entries: int) -> None:
        self.window_ms = window_ms
        self.max_entries = max_entries
        self._keys: list[str] = []
        self._topics: list[str] = []
        self._rows = bytearray()
        self._base = 0  # sequence number of _keys[0]
        self._head = 0  # sequence number of the oldest row still remembered
        self._index: dict[str, int] = {}  # key -> sequence number of its row

    def __len__(self) -> int:
        return len(self._index)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DedupTable) and self.snapshot() == other.snapshot()

    def get(self, key: str) -> tuple[str, int, int, int] | None:
        seq = self._index.get(key)
        if seq is None:
            return None
        i = seq - self._base
        qid, offset, ts = ROW.unpack_from(self._rows, i * ROW_BYTES)
        return self._topics[i], qid, offset, ts

    def remember(self, key: str, topic: str, queue_id: int, offset: int, store_ts_ms: int) -> None:
        self._index[key] = self._base + len(self._keys)
        self._keys.append(key)
        self._topics.append(topic)
        self._rows += ROW.pack(queue_id, offset, store_ts_ms)
        if len(self._index) > self.max_entries:
            while len(self._index) > self.max_entries:
                self._forget_oldest()
            self._compact()

    def expire(self, now_ms: int) -> None:
        """Forget keys stored before ``now_ms`` minus the window."""
        horizon = now_ms - self.window_ms
        end = self._base + len(self._keys)
        while self._head < end:
            i = self._head - self._base
            if ROW.unpack_from(self._rows, i * ROW_BYTES)[2] >= horizon:
                break
            self._forget_oldest()
        self._compact()

    def forget_topic(self, topic: str) -> None:
        """Forget every key stored for ``topic`` (the topic was deleted)."""
        live = [r for r in self.rows() if r[1] != topic]
        self._load(live)

    def _forget_oldest(self) -> None:
        i = self._head - self._base
        key = self._keys[i]
        if self._index.get(key) == self._head:  # not stored again since
            del self._index[key]
        self._head += 1

    def _compact(self) -> None:
        dead = self._head - self._base
        if dead >= COMPACT_MIN and dead * 2 >= len(self._keys):
            del self._keys[:dead]
            del self._topics[:dead]
            del self._rows[:dead * ROW_BYTES]
            self._base = self._head

    def rows(self) -> list[tuple[str, str, int, int, int]]:
        """Remembered rows, oldest first: (key, topic, queue id, offset, store time)."""
        start = self._head - self._base
        out = []
        for k in range(start, len(self._keys)):
            key = self._keys[k]
            if self._index.get(key) == self._base + k:
                out.append((key, self._topics[k], *ROW.unpack_from(self._rows, k * ROW_BYTES)))
        return out

    def _load(self, rows: list[tuple[str, str, int, int, int]]) -> None:
        self._keys, self._topics, self._rows = [], [], bytearray()
        self._base = self._head = 0
        self._index = {}
        for key, topic, qid, offset, ts in rows:
            self.remember(key, topic, qid, offset, ts)

    # -- checkpoint ------------------------------------------------------------------------------

    def snapshot(self) -> list[Any]:
        """[keys, topics, packed rows] from the oldest remembered row: list slices and one copy.
        A key stored again later leaves its older row in place (it no longer answers lookups),
        so the columns, and with them the snapshot, are the same on every replica."""
        start = self._head - self._base
        return [self._keys[start:], self._topics[start:], bytes(self._rows[start * ROW_BYTES:])]

    @classmethod
    def restore(cls, window_ms: int, max_entries: int, blob: Any) -> DedupTable:
        keys, topics, rows = blob
        if not (isinstance(keys, list) and isinstance(topics, list) and isinstance(rows, bytes)
                and len(keys) == len(topics) and len(rows) == len(keys) * ROW_BYTES):
            raise ValueError("malformed dedup table")
        table = cls(window_ms, max_entries)
        table._keys, table._topics, table._rows = keys, topics, bytearray(rows)
        table._index = {key: seq for seq, key in enumerate(keys)}  # a later row of a key wins
        return table

    @classmethod
    def from_rows(cls, window_ms: int, max_entries: int,
                  rows: list[tuple[str, str, int, int, int]]) -> DedupTable:
        """From (key, topic, queue id, offset, store time) rows, oldest first."""
        table = cls(window_ms, max_entries)
        table._load(rows)
        return table
