"""A dedup table from a checkpoint (``DedupTable.restore``): every field of the blob checked
before it is trusted (a ValueError names what is wrong; nothing malformed is kept to fail on the
send path later), the rows placed in fresh slots, the entries bound applied as they are placed
(a bound lowered since the checkpoint never overfills the slots).

Two forms: the runs' (``DedupTable.snapshot``: [epoch, newest, queues, head, [first rows,
words, times], rows]) and the one before the runs (24-byte rows: a 96-bit fingerprint, the store
time since the epoch and the queue word each), whose rows are added again in order at the same
epoch and queue references, so that replicas restoring different old checkpoints agree.
"""

from __future__ import annotations

import struct
from array import array
from itertools import pairwise
from typing import Any

from broker.core.dedup_format import FP_BYTES, OFFSET_BITS, RUN_MASK, SEQ_MASK, TS_SPAN

OLD_ROW = struct.Struct("<12sIQ")  # before the runs: fingerprint, store time - epoch, queue word


def _int(value: Any) -> bool:
    return type(value) is int


def restore_into(table: Any, blob: Any) -> Any:
    """``table`` (a new, empty ``DedupTable``: its internals are this module's to set) holding
    the checkpointed ``blob``."""
    if not (isinstance(blob, list) and len(blob) in (5, 6)):
        raise ValueError("malformed dedup table")
    epoch, newest, queues, head = blob[:4]
    rows = blob[-1]
    if not (_int(epoch) and _int(newest) and _int(head) and head >= 0
            and 0 <= newest - epoch < TS_SPAN and isinstance(queues, list)
            and isinstance(rows, bytes)):
        raise ValueError("malformed dedup table: epoch, newest time, head or rows")
    if not all(isinstance(q, list) and len(q) == 2 and isinstance(q[0], str) and _int(q[1])
               for q in queues):
        raise ValueError("malformed dedup table: a queue is not [topic, queue id]")
    table._queues = [(t, q) for t, q in queues]
    table._queue_refs = {q: i for i, q in enumerate(table._queues)}
    table._epoch, table._newest, table._head, table._base = epoch, newest, head, head
    if len(blob) == 5:
        _old_rows(table, rows)
    else:
        _runs(table, blob[4], len(rows))
        _place(table, rows)
    return table


def _runs(table: Any, runs: Any, rows_bytes: int) -> None:
    """The runs checked and kept: the first holds the head row (cut to begin there), each
    later one begins past it and before the end, in order; their times never go back nor past
    the newest; every row of every run names a queue."""
    if not (isinstance(runs, list) and len(runs) == 3
            and all(isinstance(b, bytes) for b in runs) and rows_bytes % FP_BYTES == 0):
        raise ValueError("malformed dedup table runs")
    firsts, words, times = array("I", runs[0]), array("Q", runs[1]), array("I", runs[2])
    n, head = rows_bytes // FP_BYTES, table._head
    if not len(firsts) == len(words) == len(times) or bool(firsts) != bool(n):
        raise ValueError("malformed dedup table runs: counts")
    if not n:
        return
    past = [(f - firsts[0]) & RUN_MASK for f in firsts]
    at = (head - firsts[0]) & RUN_MASK  # (0 but in checkpoints that did not cut their first)
    ends = [*past[1:], at + n]
    if not (at < 1 << 31 and all(at < p < at + n for p in past[1:])
            and all(a < b for a, b in pairwise(past))
            and all(a <= b for a, b in pairwise(times))
            and times[-1] <= table._newest - table._epoch
            and all((w + e - p - 1) >> OFFSET_BITS < len(table._queues)
                    for w, p, e in zip(words, past, ends, strict=True))):
        raise ValueError("malformed dedup table runs")
    words[0] += at
    firsts[0] = head & RUN_MASK
    table._run_first, table._run_word, table._run_ts = firsts, words, times
    end = head + n
    table._run_next = (end, words[-1] + ((end - firsts[-1]) & RUN_MASK), times[-1])


HOME = struct.Struct(f"<I{FP_BYTES - 4}x")  # a row's home slot: its first 4 bytes (``_find``)


def _place(table: Any, rows: bytes) -> None:
    """The rows in fresh slots, in order (a key's later row takes its slot), the bound kept."""
    table._rows = bytearray(rows)
    n = len(rows) // FP_BYTES
    if not n:
        return
    table._allocate()
    if n <= table.max_entries:
        _place_within_bound(table, rows, n)
        return
    slots, find, head = table._slots, table._find, table._head
    for k in range(n):
        o = k * FP_BYTES
        i, older = find(rows[o:o + FP_BYTES])
        slots[i] = ((head + k) & SEQ_MASK) + 1
        if older < 0:
            table._live += 1
            while table._live > table.max_entries:  # (the bound was lowered)
                table._forget_oldest()


def _place_within_bound(table: Any, rows: bytes, n: int) -> None:
    """``_place`` when the rows fit the bound (nothing to forget: the common case, a restart
    with the bound unchanged), about twice as fast: the home slots read in one pass, and a row
    whose home slot is empty placed there without a probe (at most half the slots are ever in
    use, so most are); a row that finds its home taken is probed for as ``_find`` does, inline."""
    slots, head, base, mask = table._slots, table._head, table._base, table._mask
    live = 0
    for k, (home,) in enumerate(HOME.iter_unpack(rows)):
        i = home & mask
        v = slots[i]
        if v:  # the probe of ``_find``, inline
            o = k * FP_BYTES
            fp = rows[o:o + FP_BYTES]
            while v:
                p = ((v - 1 - base) & SEQ_MASK) * FP_BYTES
                if rows[p:p + FP_BYTES] == fp:
                    live -= 1  # (the key's earlier row: this one takes its slot)
                    break
                i = (i + 1) & mask
                v = slots[i]
        slots[i] = ((head + k) & SEQ_MASK) + 1
        live += 1
    table._live = live


def _old_rows(table: Any, rows: bytes) -> None:
    """The 24-byte rows added again in order (their fingerprints' first 10 bytes: what
    ``fingerprint`` gives), at the checkpoint's epoch and queue references."""
    if len(rows) % OLD_ROW.size:
        raise ValueError("malformed dedup table")
    if rows:
        table._allocate()
    refs, span, last = len(table._queues), table._newest - table._epoch, 0
    for fp, dts, word in OLD_ROW.iter_unpack(rows):
        if word >> OFFSET_BITS >= refs or not last <= dts <= span:
            raise ValueError("malformed dedup table: a row names no queue, or its time is "
                             "out of order")
        last = dts
        i, o = table._find(fp[:FP_BYTES])
        table._append(fp[:FP_BYTES], i, o, table._base + len(table._rows) // FP_BYTES, word, dts)
