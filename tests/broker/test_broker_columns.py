"""The broker state's compact columns: packed consume queues and the columnar dedup table behave
like the plain structures they replace, and survive a checkpoint exactly."""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.consumequeue import UNIT_BYTES, ConsumeQueue, CQUnit
from broker.core.dedup import COMPACT_MIN, ROW_BYTES, TS_SPAN, DedupTable, fingerprint
from broker.machine.state import BrokerState


def test_a_consume_queue_reads_like_a_list_of_units() -> None:
    q = ConsumeQueue()
    units = [CQUnit(1000 * i, i % 3, 100 + i, i * 7, 5000 + 10 * i) for i in range(50)]
    for u in units:
        q.append(u.position, u.slot, u.size, u.tag_hash, u.store_ts_ms)
    assert len(q) == 50 and q[0] == units[0] and q[-1] == units[-1]
    assert q[10:20] == units[10:20] and q[45:99] == units[45:] and q[60:70] == []
    assert list(q) == units
    with pytest.raises(IndexError):
        q[50]
    # binary search by store time, as the timestamp lookup does, without unpacking the queue
    assert bisect.bisect_left(q, 5105, key=lambda u: u.store_ts_ms) == 11
    copy = ConsumeQueue(q.packed())
    assert copy == q and len(q.packed()) == 50 * UNIT_BYTES
    with pytest.raises(ValueError):
        ConsumeQueue(b"\x00" * (UNIT_BYTES + 1))


class Model:
    """The dedup table's meaning with store times in log order: an insertion-ordered map where a
    key stored again moves to the newest end."""

    def __init__(self, window_ms: int, max_entries: int) -> None:
        self.window_ms, self.max_entries = window_ms, max_entries
        self.rows: dict[str, tuple[str, int, int, int]] = {}

    def remember(self, key: str, topic: str, qid: int, offset: int, ts: int) -> None:
        self.rows.pop(key, None)
        self.rows[key] = (topic, qid, offset, ts)
        while len(self.rows) > self.max_entries:
            del self.rows[next(iter(self.rows))]

    def expire(self, now_ms: int) -> None:
        while self.rows and next(iter(self.rows.values()))[3] < now_ms - self.window_ms:
            del self.rows[next(iter(self.rows))]

    def forget_topic(self, topic: str) -> None:
        self.rows = {k: v for k, v in self.rows.items() if v[0] != topic}


dedup_ops = st.lists(st.one_of(
    st.tuples(st.just("remember"), st.integers(0, 8), st.sampled_from(["a", "b"]),
              st.integers(0, 3), st.integers(0, 10)),
    st.tuples(st.just("expire"), st.integers(0, 10)),
    st.tuples(st.just("forget"), st.sampled_from(["a", "b"])),
    st.tuples(st.just("checkpoint")),
), max_size=120)


@settings(max_examples=200, deadline=None)
@given(ops=dedup_ops, window=st.integers(1, 40), max_entries=st.integers(1, 25))
def test_the_dedup_table_matches_its_model_across_checkpoints(ops, window: int,
                                                               max_entries: int) -> None:
    table, model = DedupTable(window, max_entries), Model(window, max_entries)
    now = 0
    for k, op in enumerate(ops):
        if op[0] == "remember":
            _, key, topic, qid, step = op
            now += step  # store times follow log order
            table.remember(f"K{key}", topic, qid, k, now)
            model.remember(f"K{key}", topic, qid, k, now)
        elif op[0] == "expire":
            now += op[1]
            table.expire(now)
            model.expire(now)
        elif op[0] == "forget":
            table.forget_topic(op[1])
            model.forget_topic(op[1])
        else:
            restored = DedupTable.restore(window, max_entries, table.snapshot())
            assert restored == table
            table = restored
        assert len(table) == len(model.rows)
        for key in range(9):
            assert table.get(f"K{key}") == model.rows.get(f"K{key}")
    assert table.rows() == [(fingerprint(k), *v) for k, v in model.rows.items()]


def test_the_dedup_columns_drop_forgotten_rows_in_chunks() -> None:
    table = DedupTable(window_ms=10, max_entries=10_000)
    for i in range(3 * COMPACT_MIN):
        table.expire(i)
        table.remember(f"K{i}", "t", 0, i, i)
    assert len(table) == 11  # the window holds store times i-10 .. i
    assert len(table.snapshot()[5]) <= 2 * COMPACT_MIN * ROW_BYTES  # forgotten rows did not pile up
    assert len(table._run_first) <= 2 * COMPACT_MIN  # nor their runs
    assert table.get(f"K{3 * COMPACT_MIN - 1}") == ("t", 0, 3 * COMPACT_MIN - 1, 3 * COMPACT_MIN - 1)
    assert table.get("K0") is None


def test_a_version_1_checkpoint_is_still_read() -> None:
    import cbor2
    blob = cbor2.dumps([1, 7, [["t", 4, 4, 6]], [["t", 0, [[100, 0, 5, 0, 1000], [200, 1, 6, 0, 1001]]]],
                        [["g", "t", 0, 1]], [["K1", "t", 0, 0, 1000], ["K2", "t", 0, 1, 1001]]])
    state = BrokerState.restore(blob)
    assert state.applied_index == 7
    assert state.units("t", 0, 0, 10) == [CQUnit(100, 0, 5, 0, 1000), CQUnit(200, 1, 6, 0, 1001)]
    assert state.dedup.get("K2") == ("t", 0, 1, 1001)
    assert BrokerState.restore(state.snapshot()).snapshot() == state.snapshot()


def test_the_dedup_table_holds_a_key_in_a_10_byte_row_runs_and_slots_sized_for_its_bound() -> None:
    table = DedupTable(window_ms=60_000, max_entries=300_000)
    assert table._slots.tobytes() == b""  # no slots until the first key
    for i in range(200_000):  # (runs of 25 keys: one queue, one time)
        assert table.lookup_or_add(f"U{i:016d}", "t", i // 25 % 4, i // 100 * 25 + i % 25,
                                   1000 + i // 100) is None
    rows, slots = table.snapshot()[5], table._slots.tobytes()
    assert len(table) == 200_000 and len(rows) == 10 * len(table)
    assert len(table._run_first) == 200_000 // 25
    assert len(slots) == 4 * (1 << 20)  # the power of two at or above twice the bound
    assert table.get("U0000000000123456") == ("t", 2, 30856, 1000 + 1234)
    assert table.lookup_or_add("U0000000000123456", "t", 3, 7, 5000) == ("t", 2, 30856, 2234)
    assert table.get("U0000000000200000") is None
    assert table.lookup_or_add("U0000000000123456", "u", 1, 9, 5000) is None  # another topic
    assert table.get("U0000000000123456") == ("u", 1, 9, 5000) and len(table) == 200_000


def test_store_times_beyond_the_epochs_span_move_the_epoch() -> None:
    table = DedupTable(window_ms=1000, max_entries=10)
    table.remember("old", "t", 0, 0, 5)
    table.remember("a", "t", 0, 1, TS_SPAN)  # 'old' is past any window by now
    table.remember("b", "t", 0, 2, TS_SPAN + 7)
    assert table.get("old") is None and table.get("a") == ("t", 0, 1, TS_SPAN)
    assert table.get("b") == ("t", 0, 2, TS_SPAN + 7)
    restored = DedupTable.restore(1000, 10, table.snapshot())
    assert restored == table and restored.get("b") == ("t", 0, 2, TS_SPAN + 7)
    table.expire(TS_SPAN + 1001)
    assert table.get("a") is None and table.get("b") is not None
