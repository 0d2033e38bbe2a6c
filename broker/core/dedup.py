"""The dedup table of unique keys: which retried sends were stored already, and where.

unique key -> (topic, queue id, queue offset, store time), kept in insertion order and forgotten
from the oldest end: past the window (by the entries' store times, never a local clock) or past
the entry count bound. Part of the broker's state machine: deterministic, identical on every
replica. No Python object per key; its memory, per key remembered:

- rows: a ``bytearray`` of 10-byte fingerprints in insertion order, dropped from the front in
  chunks once forgotten (a row's number counts every row ever added). A key is held as an 80-bit
  fingerprint (the first 10 bytes of its 96-bit BLAKE2b digest): two keys are taken for one only
  if their fingerprints collide, which at the bound of a million keys happens to a new key with
  probability below 2**-60 (8.7e-19);
- runs: where the keys' messages are, per run of keys that one send stored into one queue at one
  time (a batch's, a group commit's for one queue): three arrays (first row number mod 2**32;
  queue reference << 40 | first queue offset; store time in ms since the table's epoch), 16 bytes
  a run, so that a duplicate answers with the original's result;
- slots: an open-addressing table (linear probing, 32-bit row numbers, 0 empty) sized for the
  bound at the first key, at most half full (8 MiB for the default million keys: 8.4 bytes a
  key; two thirds full, adding at the bound cost 1.6 times as much); forgetting a row empties
  its slot by shifting the probe sequence back: no tombstones, never rebuilt on the send path;
- queues: the (topic, queue id) a reference names, in order of first use.

A checkpoint holds the runs and rows as byte strings, read in place by its writer (``pin_rows``:
while a pin is held, and they are counted, no buffer is compacted); a restore places the rows in
fresh slots again (no key is hashed again; about 0.4 s for a million keys: ``dedup_restore``).
Checkpoints from before the runs (24-byte rows: 96-bit fingerprint, store time, queue and
offset) are still read.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from typing import Any

from broker.core.dedup_format import (
    COMPACT_MIN,
    FP_BYTES,
    OFFSET_BITS,
    OFFSET_MASK,
    QUEUE_REFS_MAX,
    ROW_BYTES,
    RUN_BYTES,
    RUN_MASK,
    SEQ_MASK,
    SLOTS_MIN,
    TS_SPAN,
    Range,
    copy_range,
)
from broker.core.dedup_restore import restore_into

__all__ = ["COMPACT_MIN", "FP_BYTES", "OFFSET_MASK", "ROW_BYTES", "RUN_BYTES", "TS_SPAN",
           "DedupTable", "Range", "copy_range", "fingerprint"]


def fingerprint(key: str) -> bytes:
    return hashlib.blake2b(key.encode(), digest_size=12).digest()[:FP_BYTES]


class DedupTable:
    __slots__ = ("window_ms", "max_entries", "_rows", "_base", "_head", "_live", "_slots",
                 "_mask", "_epoch", "_newest", "_queues", "_queue_refs", "_last_queue", "_pins",
                 "_run_first", "_run_word", "_run_ts", "_head_run", "_run_next")

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
        self._mask = 0  # len(_slots) - 1 (a power of two less one)
        self._epoch = 0  # store times are kept as ms since this
        self._newest = 0  # the newest store time seen (kept times never go back)
        self._queues: list[tuple[str, int]] = []
        self._queue_refs: dict[tuple[str, int], int] = {}
        self._last_queue: tuple[str, int, int] = ("", -1, -1)  # (topic, queue id, its ref)
        self._pins = 0  # views of the rows buffer being read (a checkpoint, a digest)
        self._run_first = array("I")  # per run: its first row number (mod 2**32, increasing)
        self._run_word = array("Q")  # per run: queue ref << 40 | its first row's queue offset
        self._run_ts = array("I")  # per run: store time - epoch
        self._head_run = 0  # the run holding row _head (runs before it are dropped with rows)
        self._run_next = (-1, -1, -1)  # (row, word, time) of a row that would go on the last run

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
            o = ((v - 1 - base) & SEQ_MASK) * FP_BYTES
            if rows[o:o + FP_BYTES] == fp:
                return i, o
            i = (i + 1) & mask

    def _run_of(self, r: int) -> int:
        """The run holding row ``r`` (at or past the head). Run numbers are compared by their
        distance past the first run kept, which no row in the table precedes."""
        firsts = self._run_first
        origin, lo, hi = firsts[0], self._head_run, len(firsts)
        target = (r - origin) & RUN_MASK
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            if (firsts[mid] - origin) & RUN_MASK <= target:
                lo = mid
            else:
                hi = mid
        return lo

    def _row(self, o: int) -> tuple[str, int, int, int]:
        r = self._base + o // FP_BYTES
        k = self._run_of(r)
        word = self._run_word[k] + ((r - self._run_first[k]) & RUN_MASK)
        topic, qid = self._queues[word >> OFFSET_BITS]
        return topic, qid, word & OFFSET_MASK, self._epoch + self._run_ts[k]

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

    def lookup_or_add_run(self, keys: Sequence[str], topic: str, queue_id: int,
                          qids: Sequence[int] | None, offset: int, store_ts_ms: int,
                          found: list[tuple[str, int, int, int] | None],
                          dups: bool = True) -> None:
        """``lookup_or_add`` for each key of a run stored into one queue from ``offset`` on (the
        apply's one call a run), each answer appended to ``found`` once decided (a run that
        raised got that far). A stored key takes the next offset, a duplicate none, an empty key
        no row. ``qids``: per key, the queue id its row names. ``dups`` False: the canary
        ``dedup_ignored`` (a duplicate stored again, no row added). The same rows, runs and
        slots as one by one (``tests/broker/dedup_model``), the common add inlined."""
        blake2b, fp_bytes = hashlib.blake2b, FP_BYTES
        for k, key in enumerate(keys):
            if not key:
                found.append(None)
                offset += 1
                continue
            qid = queue_id if qids is None else qids[k]
            fp = blake2b(key.encode(), digest_size=12).digest()[:fp_bytes]
            slots, rows, mask, base = self._slots, self._rows, self._mask, self._base
            if not slots:  # (sized at the first key; a rebuild before may leave none)
                self._allocate()
                slots, mask = self._slots, self._mask
            i = int.from_bytes(fp[:4], "little") & mask
            while True:  # (``_find``)
                v = slots[i]
                if v == 0:
                    o = -1
                    break
                o = ((v - 1 - base) & SEQ_MASK) * fp_bytes
                if rows[o:o + fp_bytes] == fp:
                    break
                i = (i + 1) & mask
            if o >= 0:
                row = self._row(o)
                if row[0] == topic:
                    found.append(row if dups else None)
                    offset += 0 if dups else 1
                    continue
            n = base + len(rows) // fp_bytes
            last_topic, last_qid, ref = self._last_queue
            newest = self._newest
            ts = store_ts_ms if store_ts_ms > newest else newest
            dts = ts - self._epoch
            if (last_qid == qid and last_topic == topic and self._head != n
                    and 0 <= offset <= OFFSET_MASK and dts < TS_SPAN):  # (``_add``'s common case)
                self._newest = ts
                self._append(fp, i, o, n, ref << OFFSET_BITS | offset, dts)
            else:
                self._add(fp, i, o, topic, qid, offset, store_ts_ms)
            found.append(None)
            offset += 1

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
        n = self._base + len(self._rows) // FP_BYTES  # the new row's number
        if self._head == n:  # empty: a fresh epoch
            self._epoch = self._newest = store_ts_ms
        ts = store_ts_ms if store_ts_ms > self._newest else self._newest
        if ts - self._epoch >= TS_SPAN:
            self._rebase(ts)
            self._remember_fp(fp, topic, queue_id, offset, ts)
            return
        self._newest = ts
        self._append(fp, i, o, n, ref << OFFSET_BITS | offset, ts - self._epoch)

    def _append(self, fp: bytes, i: int, o: int, n: int, word: int, dts: int) -> None:
        """Row ``n``, of ``fp`` (its slot ``i``; ``o``: its older row or -1), in the last run if
        it goes on there (the next row, offset and the same time, not past an empty table);
        then the bound kept."""
        self._rows += fp
        if self._run_next != (n, word, dts) or self._head == n:
            self._run_first.append(n & RUN_MASK)
            self._run_word.append(word)
            self._run_ts.append(dts)
        self._run_next = (n + 1, word + 1, dts)
        self._slots[i] = (n & SEQ_MASK) + 1  # a key stored again: its older row dead
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
        end = self._base + len(self._rows) // FP_BYTES
        firsts, times = self._run_first, self._run_ts
        k = self._head_run
        if self._head < end:
            k = self._head_run = self._next_runs(k)
            if times[k] >= horizon:
                return  # (the common case: nothing to forget, nothing to compact)
        while self._head < end:
            k = self._next_runs(k)
            if times[k] >= horizon:
                break
            last = (self._head + ((firsts[k + 1] - self._head) & RUN_MASK) if k + 1 < len(firsts)
                    else end)
            while self._head < last:
                self._forget_oldest()
        self._head_run = k
        self._compact()

    def _next_runs(self, k: int) -> int:
        """The run holding the head row, from run ``k`` (at or before it) on."""
        firsts, head = self._run_first, self._head
        origin = firsts[0]
        at = (head - origin) & RUN_MASK
        while k + 1 < len(firsts) and (firsts[k + 1] - origin) & RUN_MASK <= at:
            k += 1
        return k

    def forget_topic(self, topic: str) -> None:
        """Forget every key stored for ``topic`` (the topic was deleted)."""
        self._rebuild(lambda t: t != topic)

    def _forget_oldest(self) -> None:
        """Forget the oldest row, emptying its key's slot unless the key was stored again since
        (its slot then names the newer row); the entries after the slot that probed past it
        move back, so a probe still ends at the first empty slot."""
        slots, rows, mask, base = self._slots, self._rows, self._mask, self._base
        head_o = (self._head - base) * FP_BYTES
        self._head += 1
        fp = rows[head_o:head_o + FP_BYTES]
        i = int.from_bytes(fp[:4], "little") & mask
        while True:  # (``_find``, inlined: this runs for every key forgotten)
            v = slots[i]
            if v == 0:
                return  # (not in the table: forgotten with its topic)
            o = ((v - 1 - base) & SEQ_MASK) * FP_BYTES
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
            o = ((v - 1 - base) & SEQ_MASK) * FP_BYTES
            home = int.from_bytes(rows[o:o + 4], "little") & mask
            if (j - home) & mask >= (j - i) & mask:
                slots[i] = v
                i = j
        slots[i] = 0

    def _compact(self) -> None:
        dead = self._head - self._base
        if self._pins:
            return  # a checkpoint or a digest is reading it: later
        if dead >= COMPACT_MIN and dead * 2 >= len(self._rows) // FP_BYTES:
            del self._rows[:dead * FP_BYTES]
            self._base = self._head
            k = self._next_runs(self._head_run) if self._run_first else 0
            del self._run_first[:k], self._run_word[:k], self._run_ts[:k]
            self._head_run = 0

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
        while (self._head < self._base + len(self._rows) // FP_BYTES
               and ts - self._oldest_ts() >= TS_SPAN):
            self._forget_oldest()
        self._rebuild(lambda t: True)  # (its first row sets the epoch)
        if not self._live:
            self._epoch = self._newest = ts

    def _oldest_ts(self) -> int:
        return self._epoch + self._run_ts[self._run_of(self._head)]

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
        for r in sorted((v - 1 - self._base) & SEQ_MASK for v in self._slots if v):
            o = r * FP_BYTES
            out.append((bytes(self._rows[o:o + FP_BYTES]), *self._row(o)))
        return out

    # -- checkpoint ------------------------------------------------------------------------------

    def snapshot(self) -> list[Any]:
        """[epoch, newest time, queues, head row number, runs, rows from the head]: copies; the
        runs as [first rows, words, times], the first cut to begin at the head row (so that a
        replica restored from any checkpoint holds the same bytes). No slots."""
        firsts, words, times, rows = (b"".join(p if isinstance(p, bytes) else copy_range(p)
                                               for p in part) for part in self._parts())
        return [*self.snapshot_head(), [firsts, words, times], rows]

    def snapshot_head(self) -> list[Any]:
        """``snapshot()`` but its last two fields (``pin_rows`` gives them in place)."""
        return [self._epoch, self._newest, [list(q) for q in self._queues], self._head]

    def _parts(self) -> list[list[bytes | Range]]:
        if self._head == self._base + len(self._rows) // FP_BYTES:
            return [[], [], [], [(self._rows, len(self._rows), len(self._rows))]]
        k = self._run_of(self._head)
        firsts, words, times = self._run_first, self._run_word, self._run_ts
        cut = (self._head - firsts[k]) & RUN_MASK
        heads = ((self._head & RUN_MASK).to_bytes(4, "little"),
                 (words[k] + cut).to_bytes(8, "little"), times[k].to_bytes(4, "little"))
        parts: list[list[bytes | Range]] = [
            [head, (b, (k + 1) * b.itemsize, len(b) * b.itemsize)]
            for head, b in zip(heads, (firsts, words, times), strict=True)]
        parts.append([(self._rows, (self._head - self._base) * FP_BYTES, len(self._rows))])
        return parts

    def pin_rows(self) -> list[list[bytes | Range]]:
        """``snapshot()``'s runs and rows, the bytes or (buffer, start, end) ranges in place, per
        field. Until every pin is matched by ``unpin_rows`` no buffer is compacted, so the
        ranges stay as they are (runs and rows are appended past them; a rebuild takes new
        buffers)."""
        self._pins += 1
        return self._parts()

    def unpin_rows(self) -> None:
        if self._pins <= 0:
            raise RuntimeError("unpin_rows without a pin_rows")
        self._pins -= 1

    @classmethod
    def restore(cls, window_ms: int, max_entries: int, blob: Any) -> DedupTable:
        """From a checkpoint's ``snapshot()`` (``broker.core.dedup_restore``: every field
        checked; ValueError for what is not a table)."""
        table: DedupTable = restore_into(cls(window_ms, max_entries), blob)
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
