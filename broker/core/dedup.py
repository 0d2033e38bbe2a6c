"""The dedup table of unique keys: which retried sends were stored already, and where.

unique key -> (topic, queue id, queue offset, store time), kept in insertion order and forgotten
from the oldest end: past the window (by the entries' store times, never a local clock) or past
the entry count bound. Part of the broker's state machine, so it is deterministic and identical on
every replica.

Its memory is stated per key: a 24-byte row per key remembered, and a hash table of 4-byte slots
sized for the bound at the first key (at most half full: 8 MiB for the default million keys, 8.4
bytes a key at the bound), with no Python object per key. A key is held as a 96-bit BLAKE2b
fingerprint, not as its text: two different keys are taken for one only if their fingerprints
collide, which for a table at its bound of a million keys happens to a new key with probability
below 2**-76 (1.3e-23); the original's queue and offset are kept, so a duplicate still answers with
the original's result.

- rows: a ``bytearray`` of 24-byte rows in insertion order (fingerprint; store time in ms since
  the table's epoch, 32 bits; queue reference << 40 | queue offset), dropped from the front in
  chunks once forgotten;
- slots: an open-addressing table (linear probing, an ``array`` of 32-bit row numbers, 0 empty)
  from a fingerprint to the newest row of its key; forgetting a row empties its slot by shifting
  the probe sequence back, so no tombstones pile up and the table is never rebuilt or resized
  on the send path;
- queues: the (topic, queue id) a reference names, in order of first use.

A checkpoint writes the rows as one byte string; a restore places them in fresh slots again (no
key is hashed again; about 0.8 s for a million keys). The checkpoint writer reads them in place
(``pin_rows``): while any pin is held (they are counted: a checkpoint's, a digest's), the rows
buffer is appended to but never compacted, so the rows a checkpoint captured stay where they
were without a copy of them all.
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from typing import Any

FP_BYTES = 12
ROW = struct.Struct("<12sIQ")  # fingerprint, store time - epoch (ms), queue ref << 40 | offset
ROW_BYTES = ROW.size
OFFSET_BITS = 40
OFFSET_MASK = (1 << OFFSET_BITS) - 1
QUEUE_REFS_MAX = 1 << (64 - OFFSET_BITS)
TS_SPAN = 1 << 32  # store times within a table's epoch + this
SEQ_MASK = (1 << 31) - 1  # row numbers are kept modulo 2**31 (+1: 0 is an empty slot)
SLOTS_MIN = 1024
COMPACT_MIN = 4096  # forgotten rows are dropped from the front in chunks at least this large


def fingerprint(key: str) -> bytes:
    return hashlib.blake2b(key.encode(), digest_size=FP_BYTES).digest()


class DedupTable:
    __slots__ = ("window_ms", "max_entries", "_rows", "_base", "_head", "_live", "_slots",
                 "_mask", "_epoch", "_newest", "_queues", "_queue_refs", "_last_queue", "_pins")

    def __init__(self, window_ms: int, max_entries: int) -> None:
        if not 0 < window_ms < TS_SPAN // 2:
            raise ValueError(f"dedup window must be 1 .. {TS_SPAN // 2 - 1} ms, not {window_ms}")
        if not 0 < max_entries < 1 << 29:
            raise ValueError(f"dedup entries bound must be 1 .. {(1 << 29) - 1}, not {max_entries}")
        self.window_ms = window_ms
        self.max_entries = max_entries
        self._rows = bytearray()
        self._base = 0  # row number of _rows' first row
        self._head = 0  # row number of the oldest row not yet forgotten
        self._live = 0  # keys remembered (slots in use)
        self._slots = array("I")  # sized for the bound at the first key (then never resized)
        self._mask = 0
        self._epoch = 0  # store times are kept as ms since this
        self._newest = 0  # the newest store time seen (kept times never go back)
        self._queues: list[tuple[str, int]] = []
        self._queue_refs: dict[tuple[str, int], int] = {}
        self._last_queue: tuple[str, int, int] = ("", -1, -1)  # (topic, queue id, its ref)
        self._pins = 0  # views of the rows buffer being read (a checkpoint, a digest)

    def __len__(self) -> int:
        return self._live

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DedupTable) and self.snapshot() == other.snapshot()

    # -- lookups and changes --------------------------------------------------------------------

    def _find(self, fp: bytes) -> tuple[int, int]:
        """(slot, row offset in _rows) of ``fp``'s key, or (the empty slot ending its probe, -1)."""
        slots, rows, mask, base = self._slots, self._rows, self._mask, self._base
        i = int.from_bytes(fp[:4], "little") & mask
        while True:
            v = slots[i]
            if v == 0:
                return i, -1
            o = ((v - 1 - base) & SEQ_MASK) * ROW_BYTES
            if rows[o:o + FP_BYTES] == fp:
                return i, o
            i = (i + 1) & mask

    def _row(self, o: int) -> tuple[str, int, int, int]:
        _, dts, word = ROW.unpack_from(self._rows, o)
        topic, qid = self._queues[word >> OFFSET_BITS]
        return topic, qid, word & OFFSET_MASK, self._epoch + dts

    def get(self, key: str) -> tuple[str, int, int, int] | None:
        if not self._slots:
            return None
        o = self._find(fingerprint(key))[1]
        return self._row(o) if o >= 0 else None

    def lookup_or_add(self, key: str, topic: str, queue_id: int, offset: int,
                      store_ts_ms: int) -> tuple[str, int, int, int] | None:
        """The send path's one call per message: the row of ``key`` if it is remembered for
        ``topic`` (a duplicate: nothing changes), else ``key`` is remembered at (``topic``,
        ``queue_id``, ``offset``) and None returned."""
        fp = fingerprint(key)
        if not self._slots:
            self._allocate()
        i, o = self._find(fp)
        if o >= 0:
            row = self._row(o)
            if row[0] == topic:
                return row
        self._add(fp, i, o, topic, queue_id, offset, store_ts_ms)
        return None

    def remember(self, key: str, topic: str, queue_id: int, offset: int, store_ts_ms: int) -> None:
        self._remember_fp(fingerprint(key), topic, queue_id, offset, store_ts_ms)

    def _add(self, fp: bytes, i: int, o: int, topic: str, queue_id: int, offset: int,
             store_ts_ms: int) -> None:
        """A row for ``fp`` at slot ``i`` (``o``: the offset of its older row, or -1)."""
        if not 0 <= offset <= OFFSET_MASK:
            raise ValueError(f"queue offset {offset} out of the dedup table's range")
        last_topic, last_qid, ref = self._last_queue
        if last_qid != queue_id or last_topic != topic:
            slots = self._slots
            ref = self._queue_ref(topic, queue_id)
            self._last_queue = (topic, queue_id, ref)
            if self._slots is not slots:  # (rebuilt to drop unused queue references)
                if not self._slots:
                    self._allocate()
                i, o = self._find(fp)
        n = len(self._rows) // ROW_BYTES
        if self._head == self._base + n:  # empty: a fresh epoch
            self._epoch = self._newest = store_ts_ms
        ts = store_ts_ms if store_ts_ms > self._newest else self._newest
        if ts - self._epoch >= TS_SPAN:
            self._rebase(ts)
            self._remember_fp(fp, topic, queue_id, offset, ts)
            return
        self._newest = ts
        self._rows += ROW.pack(fp, ts - self._epoch, ref << OFFSET_BITS | offset)
        self._slots[i] = ((self._base + n) & SEQ_MASK) + 1  # a key stored again: older row dead
        if o < 0:
            self._live += 1
            if self._live > self.max_entries:
                while self._live > self.max_entries:
                    self._forget_oldest()
                self._compact()

    def _remember_fp(self, fp: bytes, topic: str, queue_id: int, offset: int, ts: int) -> None:
        if not self._slots:
            self._allocate()
        i, o = self._find(fp)
        self._add(fp, i, o, topic, queue_id, offset, ts)

    def _allocate(self) -> None:
        """The slots, for the bound: at most half of them ever in use."""
        size = SLOTS_MIN
        while size < 2 * self.max_entries:
            size *= 2
        self._slots = array("I", bytes(4 * size))
        self._mask = size - 1

    def expire(self, now_ms: int) -> None:
        """Forget keys stored before ``now_ms`` minus the window."""
        horizon = now_ms - self.window_ms - self._epoch
        end = self._base + len(self._rows) // ROW_BYTES
        rows, base, unpack = self._rows, self._base, ROW.unpack_from
        while self._head < end and unpack(rows, (self._head - base) * ROW_BYTES)[1] < horizon:
            self._forget_oldest()
        self._compact()

    def forget_topic(self, topic: str) -> None:
        """Forget every key stored for ``topic`` (the topic was deleted)."""
        self._rebuild(lambda t: t != topic)

    def _forget_oldest(self) -> None:
        """Forget the oldest row, emptying its key's slot unless the key was stored again since
        (its slot then names the newer row); the entries after the slot that probed past it
        move back, so a probe still ends at the first empty slot."""
        slots, rows, mask, base = self._slots, self._rows, self._mask, self._base
        head_o = (self._head - base) * ROW_BYTES
        self._head += 1
        fp = rows[head_o:head_o + FP_BYTES]
        i = int.from_bytes(fp[:4], "little") & mask
        while True:  # (``_find``, inlined: this runs for every key forgotten)
            v = slots[i]
            if v == 0:
                return  # (not in the table: forgotten with its topic)
            o = ((v - 1 - base) & SEQ_MASK) * ROW_BYTES
            if rows[o:o + FP_BYTES] == fp:
                break
            i = (i + 1) & mask
        if o != head_o:
            return  # stored again since: the slot stays with the newer row
        self._live -= 1
        j = i
        while True:
            j = (j + 1) & mask
            v = slots[j]
            if v == 0:
                break
            o = ((v - 1 - base) & SEQ_MASK) * ROW_BYTES
            home = int.from_bytes(rows[o:o + 4], "little") & mask
            if (j - home) & mask >= (j - i) & mask:
                slots[i] = v
                i = j
        slots[i] = 0

    def _compact(self) -> None:
        dead = self._head - self._base
        if self._pins:
            return  # a checkpoint or a digest is reading it: later
        if dead >= COMPACT_MIN and dead * 2 >= len(self._rows) // ROW_BYTES:
            del self._rows[:dead * ROW_BYTES]
            self._base = self._head

    def _queue_ref(self, topic: str, queue_id: int) -> int:
        ref = self._queue_refs.get((topic, queue_id))
        if ref is None:
            if len(self._queues) >= QUEUE_REFS_MAX:
                self._rebuild(lambda t: True)  # keep only the queues still referred to
                if len(self._queues) >= QUEUE_REFS_MAX:
                    raise ValueError("the dedup table refers to too many queues")
            ref = self._queue_refs[(topic, queue_id)] = len(self._queues)
            self._queues.append((topic, queue_id))
        return ref

    def _rebase(self, ts: int) -> None:
        """Move the epoch up to the oldest row's time (store times span at most 2**32 ms):
        rows older than that span are past any window and forgotten first."""
        while (self._head < self._base + len(self._rows) // ROW_BYTES
               and ts - self._oldest_ts() >= TS_SPAN):
            self._forget_oldest()
        self._rebuild(lambda t: True)  # (its first row sets the epoch)
        if not self._live:
            self._epoch = self._newest = ts

    def _oldest_ts(self) -> int:
        dts: int = ROW.unpack_from(self._rows, (self._head - self._base) * ROW_BYTES)[1]
        return self._epoch + dts

    def _rebuild(self, keep: Any) -> None:
        """The table again from its live rows whose topic ``keep`` keeps, at the current epoch."""
        live = [r for r in self.rows() if keep(r[1])]
        epoch = self._epoch
        fresh = DedupTable(self.window_ms, self.max_entries)
        for fp, topic, qid, offset, ts in live:
            fresh._remember_fp(fp, topic, qid, offset, ts)
        if not live:
            fresh._epoch = fresh._newest = epoch
        fresh._newest = max(fresh._newest, self._newest)
        for name in self.__slots__:
            if name not in ("window_ms", "max_entries", "_pins"):  # (settings stay; rest new)
                setattr(self, name, getattr(fresh, name))

    def rows(self) -> list[tuple[bytes, str, int, int, int]]:
        """Remembered rows, oldest first: (fingerprint, topic, queue id, offset, store time)."""
        out = []
        for v in sorted((v - 1 - self._base) & SEQ_MASK for v in self._slots if v):
            fp, dts, word = ROW.unpack_from(self._rows, v * ROW_BYTES)
            topic, qid = self._queues[word >> OFFSET_BITS]
            out.append((fp, topic, qid, word & OFFSET_MASK, self._epoch + dts))
        return out

    # -- checkpoint ------------------------------------------------------------------------------

    def snapshot(self) -> list[Any]:
        """[epoch, newest time, queues, head row number, rows from the head]: one byte copy. The
        slots are not in it: a restore places the rows again (about a second per million keys),
        which keeps checkpoints and snapshots to the rows' 24 bytes a key."""
        with memoryview(self._rows) as rows:
            return [*self.snapshot_head(), bytes(rows[(self._head - self._base) * ROW_BYTES:])]

    def snapshot_head(self) -> list[Any]:
        """``snapshot()`` but its last field, the rows (``pin_rows`` gives them in place)."""
        return [self._epoch, self._newest, [list(q) for q in self._queues], self._head]

    def pin_rows(self) -> tuple[bytearray, int, int]:
        """The rows ``snapshot()`` holds, in place: (buffer, start, end) in bytes. Until every
        pin is matched by ``unpin_rows`` the buffer is never compacted, so those bytes stay as
        they are while the table goes on (rows are appended past ``end``; a rebuild takes a new
        buffer). Pins are counted: a digest's view taken while a checkpoint is being written
        leaves the checkpoint's pin in place."""
        self._pins += 1
        return self._rows, (self._head - self._base) * ROW_BYTES, len(self._rows)

    def unpin_rows(self) -> None:
        if self._pins <= 0:
            raise RuntimeError("unpin_rows without a pin_rows")
        self._pins -= 1

    @classmethod
    def restore(cls, window_ms: int, max_entries: int, blob: Any) -> DedupTable:
        if not (isinstance(blob, list) and len(blob) == 5):
            raise ValueError("malformed dedup table")
        epoch, newest, queues, head, rows = blob
        if not (isinstance(epoch, int) and isinstance(newest, int) and isinstance(head, int)
                and head >= 0 and isinstance(queues, list) and isinstance(rows, bytes)
                and len(rows) % ROW_BYTES == 0):
            raise ValueError("malformed dedup table")
        table = cls(window_ms, max_entries)
        table._epoch, table._newest, table._head, table._base = epoch, newest, head, head
        table._queues = [(str(t), int(q)) for t, q in queues]
        table._queue_refs = {q: i for i, q in enumerate(table._queues)}
        table._rows = bytearray(rows)
        n = len(rows) // ROW_BYTES
        if n:
            table._allocate()
            slots, find = table._slots, table._find
            for k in range(n):  # in order: a key's later row takes its slot
                o = k * ROW_BYTES
                i, older = find(rows[o:o + FP_BYTES])
                slots[i] = ((head + k) & SEQ_MASK) + 1
                if older < 0:
                    table._live += 1
            while table._live > max_entries:  # (the bound was lowered)
                table._forget_oldest()
        return table

    @classmethod
    def from_rows(cls, window_ms: int, max_entries: int,
                  rows: list[tuple[str, str, int, int, int]]) -> DedupTable:
        """From (key, topic, queue id, offset, store time) rows, oldest first (the checkpoints
        of earlier versions kept the keys' text)."""
        table = cls(window_ms, max_entries)
        for key, topic, qid, offset, ts in rows:
            table.remember(key, topic, qid, offset, ts)
        return table
