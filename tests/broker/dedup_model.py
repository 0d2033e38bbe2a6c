"""A plain model of the dedup table and two replicas driven by random operations (the dedup
table's property tests: ``test_dedup_replicas``, ``test_dedup_restore``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import cbor2
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import broker.core.dedup as dedup_mod
from broker.core.dedup import OFFSET_MASK, TS_SPAN, DedupTable

KEYS = [f"k{i}" for i in range(10)]
TOPICS = ["t", "u", "v"]
SETTINGS = settings(max_examples=int(os.environ.get("DEDUP_EXAMPLES", "400")),
                    deadline=None, suppress_health_check=list(HealthCheck))


# -- a plain model of the table ---------------------------------------------------------------------

class Model:
    """Every row ever added, the head, the newest row of each live key; epoch and newest time as
    the table keeps them (they decide when it rebases)."""

    def __init__(self, window: int, bound: int) -> None:
        self.window, self.bound = window, bound
        self.rows: list[tuple[str, str, int, int, int]] = []
        self.head = 0
        self.latest: dict[str, int] = {}
        self.epoch = self.newest = 0
        self.queues: list[tuple[str, int]] = []  # the table's references, in order of first use

    def get(self, key: str) -> tuple[str, int, int, int] | None:
        r = self.latest.get(key)
        return None if r is None else self.rows[r][1:]

    def _empty(self) -> bool:
        return self.head == len(self.rows)

    def forget_oldest(self) -> None:
        key = self.rows[self.head][0]
        if self.latest.get(key) == self.head:
            del self.latest[key]
        self.head += 1

    def add(self, key: str, topic: str, qid: int, offset: int, store: int) -> None:
        if (topic, qid) not in self.queues:
            if len(self.queues) >= dedup_mod.QUEUE_REFS_MAX:  # only the ones still used kept
                self.rebuild(lambda t: True)
                if len(self.queues) >= dedup_mod.QUEUE_REFS_MAX:
                    raise ValueError("too many queues")
            self.queues.append((topic, qid))
        if self._empty():
            self.epoch = self.newest = store
        ts = max(store, self.newest)
        if ts - self.epoch >= TS_SPAN:  # a rebase: rows past the span forgotten, the rest again
            while not self._empty() and ts - self.rows[self.head][4] >= TS_SPAN:
                self.forget_oldest()
            self.rebuild(lambda t: True)
            if not self.latest:
                self.epoch = self.newest = ts
            self.add(key, topic, qid, offset, ts)
            return
        self.newest = ts
        new = key not in self.latest
        self.latest[key] = len(self.rows)
        self.rows.append((key, topic, qid, offset, ts))
        if new:
            while len(self.latest) > self.bound:
                self.forget_oldest()

    def lookup_or_add(self, key: str, topic: str, qid: int, offset: int, store: int) -> Any:
        row = self.get(key)
        if row is not None and row[0] == topic:
            return row
        self.add(key, topic, qid, offset, store)
        return None

    def rebuild(self, keep: Any) -> None:
        live = [self.rows[r] for r in sorted(self.latest.values()) if keep(self.rows[r][1])]
        epoch, newest = self.epoch, self.newest
        self.rows, self.head, self.latest, self.queues = [], 0, {}, []
        for row in live:
            self.add(*row)
        if not live:
            self.epoch = self.newest = epoch
        self.newest = max(self.newest, newest)

    def expire(self, now: int) -> None:
        while not self._empty() and self.rows[self.head][4] < now - self.window:
            self.forget_oldest()

    def lower(self, bound: int) -> None:
        self.bound = bound
        while len(self.latest) > bound:
            self.forget_oldest()


# -- operations -------------------------------------------------------------------------------------

key_st = st.sampled_from(KEYS)
topic_st = st.sampled_from(TOPICS)
qid_st = st.integers(0, 2)
# None: the queue's next offset; else an offset of its own (near the 40-bit end too)
offset_st = st.one_of(st.none(), st.integers(0, 40), st.sampled_from([OFFSET_MASK - 2, OFFSET_MASK]))
dt_st = st.sampled_from([0, 0, 0, 1, 1, 2, 5, 13, -1, -4])
jump_st = st.sampled_from([1 << 31, TS_SPAN - 1, TS_SPAN, TS_SPAN + 1, TS_SPAN + 7, 3 * TS_SPAN])

op_st = st.one_of(
    st.tuples(st.just("remember"), key_st, topic_st, qid_st, offset_st, dt_st),
    st.tuples(st.just("lookup"), key_st, topic_st, qid_st, offset_st, dt_st),
    st.tuples(st.just("batch"), st.lists(key_st, min_size=1, max_size=6), topic_st, qid_st,
              offset_st, dt_st, st.booleans()),
    st.tuples(st.just("run"), st.lists(st.sampled_from(["", *KEYS]), min_size=1, max_size=8),
              topic_st, st.one_of(st.none(), st.lists(qid_st, min_size=8, max_size=8)), qid_st,
              offset_st, dt_st, st.booleans()),
    st.tuples(st.just("expire"), st.integers(-30, 30)),
    st.tuples(st.just("forget"), topic_st),
    st.tuples(st.just("jump"), jump_st),
    st.tuples(st.just("restore")),
    st.tuples(st.just("lower"), st.integers(1, 6)),
)


class _Refused(Exception):
    def __init__(self, errors: list[bool]) -> None:
        self.errors = errors


def _send(tables: tuple[Any, ...], model: Model, look: bool, *args: Any) -> None:
    """One key of a send on every table and the model: the same answers, or all refuse it."""
    answers, errors = [], []
    for t in (*tables, model):
        try:
            if look:
                answers.append(t.lookup_or_add(*args))
            else:
                answers.append((t.add if isinstance(t, Model) else t.remember)(*args))
            errors.append(False)
        except ValueError:
            answers.append("refused")
            errors.append(True)
    if any(errors):
        raise _Refused(errors)
    assert answers == [answers[-1]] * len(answers), answers


def one_by_one(table: Any, keys: list[str], topic: str, queue_id: int, qids: list[int] | None,
               offset: int, store: int, found: list[Any], dups: bool = True) -> None:
    """``DedupTable.lookup_or_add_run`` as the broker's apply did it before, a key at a time."""
    for k, key in enumerate(keys):
        if not key:
            found.append(None)
            offset += 1
            continue
        seen = table.lookup_or_add(key, topic, queue_id if qids is None else qids[k], offset,
                                   store)
        if seen is not None and dups:
            found.append(seen)
            continue
        found.append(None)
        offset += 1


def _run(tables: tuple[DedupTable, ...], model: Model, keys: list[str], topic: str, qid: int,
         qids: list[int] | None, offset: int, store: int, dups: bool) -> None:
    """A run of keys: on the first table at once, on the others and the model one by one; the
    same answers as far as each got, and all refuse it or none."""
    answers, errors = [], []
    for n, t in enumerate((*tables, model)):
        found: list[Any] = []
        try:
            if n == 0:
                tables[0].lookup_or_add_run(keys, topic, qid, qids, offset, store, found, dups)
            else:
                one_by_one(t, keys, topic, qid, qids, offset, store, found, dups)
            errors.append(False)
        except ValueError:
            errors.append(True)
        answers.append(found)
    assert answers == [answers[-1]] * len(answers), answers
    if any(errors):
        raise _Refused(errors)


class Replicas:
    """Table ``a`` applies every operation; ``b`` the same, restored from its own snapshot at
    some points; ``model`` says what lookups answer."""

    def __init__(self, window: int, bound: int, head: int, clock: int) -> None:
        self.window, self.bound = window, bound
        empty = [0, 0, [], head, [b"", b"", b""], b""]  # (rows numbered from ``head`` on)
        self.a = DedupTable.restore(window, bound, empty)
        self.b = DedupTable.restore(window, bound, empty)
        self.model = Model(window, bound)
        self.clock = clock
        self.next_offset: dict[tuple[str, int], int] = {}

    def _offset(self, topic: str, qid: int, offset: int | None, n: int) -> int | None:
        if offset is None:
            offset = self.next_offset.get((topic, qid), 0)
        if offset + n - 1 > OFFSET_MASK:
            return None
        self.next_offset[(topic, qid)] = offset + n
        return offset

    def apply(self, op: tuple[Any, ...], tables: tuple[DedupTable, ...] | None = None) -> None:
        tables = (self.a, self.b) if tables is None else tables
        try:
            self._apply(op, tables)
        except _Refused as refused:  # every table and the model refused the same send
            assert refused.errors == [True] * (len(tables) + 1), refused.errors

    def _apply(self, op: tuple[Any, ...], tables: tuple[DedupTable, ...]) -> None:
        kind = op[0]
        if kind in ("remember", "lookup"):
            _, key, topic, qid, offset, dt = op
            self.clock += dt
            offset = self._offset(topic, qid, offset, 1)
            if offset is None:
                return
            _send(tables, self.model, kind == "lookup", key, topic, qid, offset, self.clock)
        elif kind == "batch":  # one send: offsets in a row, one queue, one time
            _, keys, topic, qid, offset, dt, look = op
            self.clock += dt
            offset = self._offset(topic, qid, offset, len(keys))
            if offset is None:
                return
            for j, key in enumerate(keys):
                _send(tables, self.model, look, key, topic, qid, offset + j, self.clock)
        elif kind == "run":  # one run of a send: keys (some empty), maybe each its own queue id
            _, keys, topic, qids, qid, offset, dt, dups = op
            self.clock += dt
            offset = self._offset(topic, qid, offset, len(keys))
            if offset is None:
                return
            _run(tables, self.model, keys, topic, qid, qids, offset, self.clock, dups)
        elif kind == "expire":
            now = self.clock + op[1] + (self.window if op[1] > 0 else 0)
            for t in tables:
                t.expire(now)
            self.model.expire(now)
        elif kind == "forget":
            for t in tables:
                t.forget_topic(op[1])
            self.model.rebuild(lambda t: t != op[1])
        elif kind == "jump":
            self.clock += op[1]
        elif kind == "restore":  # b only, sometimes through CBOR as a checkpoint holds it
            blob = self.b.snapshot()
            if self.clock % 2:
                blob = cbor2.loads(cbor2.dumps(blob))
            self.b = DedupTable.restore(self.window, self.bound, blob)
        elif kind == "lower" and op[1] < self.bound:  # a restart with a lower bound
            self.bound = op[1]
            self.a = DedupTable.restore(self.window, self.bound, self.a.snapshot())
            self.b = DedupTable.restore(self.window, self.bound, self.b.snapshot())
            self.model.lower(self.bound)

    def check(self) -> None:
        sa, sb = self.a.snapshot(), self.b.snapshot()
        assert sa == sb
        for key in KEYS:
            want = self.model.get(key)
            assert self.a.get(key) == want, (key, self.a.get(key), want)
            assert self.b.get(key) == want, (key, self.b.get(key), want)
        assert len(self.a) == len(self.b) == len(self.model.latest)
        # and a snapshot restores into the same snapshot
        assert DedupTable.restore(self.window, self.bound, sa).snapshot() == sa


@contextmanager
def _small(compact_min: int, slots_min: int, refs_max: int = dedup_mod.QUEUE_REFS_MAX
           ) -> Iterator[None]:
    """Compaction after a few forgotten rows, and slots few enough to collide and wrap (at least
    two more than the bound: a bound of 1 or 2 with 2 or 3 slots fills them while a key is added,
    which the real SLOTS_MIN never allows)."""
    with mock.patch.object(dedup_mod, "COMPACT_MIN", compact_min), \
            mock.patch.object(dedup_mod, "SLOTS_MIN", slots_min), \
            mock.patch.object(dedup_mod, "QUEUE_REFS_MAX", refs_max):
        yield


setup_st = st.tuples(
    st.sampled_from([3, 20, 1000, (1 << 31) - 1]),  # window
    st.sampled_from([1, 2, 3, 5, 8, 100]),  # bound
    st.sampled_from([0, 7, (1 << 31) - 3, (1 << 32) - 4, (1 << 32) + 1, (1 << 33) - 2]),  # head
    st.sampled_from([0, 1000, TS_SPAN - 3]),  # first store time
    st.sampled_from([(1, 4), (2, 4), (4096, 1024)]),  # COMPACT_MIN, SLOTS_MIN
    st.sampled_from([2, 3, 5, dedup_mod.QUEUE_REFS_MAX]),  # queue references at most
)
