"""The dedup table's restore: checkpoints from before the runs read into the same table on
every replica, a checkpoint written from a thread while sends go on, malformed checkpoints
refused (or usable), a lowered bound."""

from __future__ import annotations

import subprocess
import threading
import types
from array import array
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.core.dedup import DedupTable
from broker.machine.state import BrokerState
from tests.broker.dedup_model import KEYS, SETTINGS, Replicas, op_st

# -- checkpoints from before the runs -----------------------------------------------------------------

def _old_table_class() -> Any:
    """The table as the version before the runs wrote it (24-byte rows), from the repository's
    history (broker/core/dedup.py at 5e2248e^)."""
    try:
        source = subprocess.run(["git", "show", "5e2248e^:broker/core/dedup.py"],
                                cwd=Path(__file__).parent, capture_output=True, text=True,
                                check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("the previous dedup table is not in this checkout's history")
    module = types.ModuleType("dedup_before_runs")
    exec(compile(source, "dedup_before_runs.py", "exec"), module.__dict__)
    return module.DedupTable


old_op_st = op_st.filter(lambda op: op[0] != "lower")


@SETTINGS
@given(window=st.sampled_from([3, 20, (1 << 31) - 1]), bound=st.sampled_from([1, 2, 3, 5, 100]),
       clock=st.sampled_from([0, 1000]), ops=st.lists(st.tuples(old_op_st, st.booleans()),
                                                       max_size=50))
def test_replicas_upgraded_from_old_checkpoints_at_different_points_agree(
        window: int, bound: int, clock: int, ops: Any) -> None:
    """Replica ``a`` upgraded at the start and applied everything with the runs; replica ``b``
    upgraded again and again: it restores the old checkpoint (24-byte rows) that a replica still
    on the previous version (``old``) wrote at that point. Their snapshots must be equal (the
    state digest compares them)."""
    old_cls = _old_table_class()
    old = old_cls(window, bound)
    r = Replicas(window, bound, 0, clock)
    for op, upgrade in ops:
        if op[0] == "restore":  # (b from its own snapshot, in the new layout)
            r.apply(op)
        else:
            r.apply(op, (r.a, r.b, old))
        if upgrade:
            r.b = DedupTable.restore(window, bound, old.snapshot())
        r.check()


def test_a_replica_upgraded_later_holds_the_same_runs() -> None:
    """A batch of 7 keys (one run) with a bound of 5; the head row is then inside the run. The
    replica upgraded first keeps the run from its first row (before the head), the one that
    converts the old rows later starts it at the head: equal lookups, different snapshots (so
    different state digests). Hypothesis' smallest case: bound 1, remember k0 at (t, 0, 0, time
    0), remember k1 at (t, 0, 1, time 0), then convert the old checkpoint."""
    old_cls = _old_table_class()

    def ops(t: Any) -> None:
        t.remember("p", "t", 0, 5, 900)
        for i in range(7):  # one send's batch: offsets 10..16, one time
            t.remember(f"k{i}", "t", 0, 10 + i, 1000)

    a = DedupTable.restore(60_000, 5, old_cls(60_000, 5).snapshot())  # upgraded first
    ops(a)
    old = old_cls(60_000, 5)
    ops(old)
    b = DedupTable.restore(60_000, 5, old.snapshot())  # upgraded after the batch
    assert [a.get(k) for k in KEYS] == [b.get(k) for k in KEYS]
    assert a.snapshot() == b.snapshot()


# -- the checkpoint writer's thread and the send path --------------------------------------------

def test_a_view_read_in_a_thread_never_stops_the_send_path() -> None:
    """The checkpoint writer iterates the view in a thread (``asyncio.to_thread`` in
    broker/shell/checkpoint.py) while the loop goes on appending rows and runs: an append must
    not fail because the writer holds a buffer export (``copy_range``'s memoryview) at that
    moment (a view held across the copy made it fail: BufferError from ``self._rows += fp``
    or ``array.append``)."""
    state = BrokerState()
    for i in range(20_000):
        state.dedup.remember(f"k{i}", "t", 0, i, 1000 + i)
    view = state.snapshot_view()
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            for _ in view:
                pass

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for i in range(20_000, 120_000):  # one send at a time: a row and a run each
            state.dedup.remember(f"k{i}", "t", 0, i, 1000 + i)
    finally:
        stop.set()
        thread.join()
        view.release()


# -- malformed checkpoints ----------------------------------------------------------------------------

def _valid_blob() -> list[Any]:
    t = DedupTable(60_000, 100)
    for i in range(6):
        t.remember(f"k{i}", "t", i % 2, i, 1000 + i // 3)
    return t.snapshot()


def _usable(table: DedupTable) -> None:
    """What the send path and a checkpoint do with a restored table."""
    table.rows()
    for key in [f"k{i}" for i in range(6)] + ["x"]:
        table.get(key)
        table.lookup_or_add(key, "t", 0, 99, 2000)
    table.expire(1_000_000)
    DedupTable.restore(table.window_ms, table.max_entries, table.snapshot())


mutation_st = st.one_of(
    st.tuples(st.just("word"), st.integers(0, 5), st.integers(0, (1 << 64) - 1)),
    st.tuples(st.just("time"), st.integers(0, 5), st.integers(0, (1 << 32) - 1)),
    st.tuples(st.just("field"), st.integers(0, 3),
              st.one_of(st.integers(-(1 << 70), 1 << 70), st.booleans(), st.none(), st.text(max_size=2),
                        st.lists(st.integers(), max_size=2))),
    st.tuples(st.just("queues"), st.lists(st.one_of(st.integers(), st.none(), st.text(max_size=2),
                                                    st.lists(st.one_of(st.text(max_size=2), st.integers(),
                                                                       st.none()), max_size=3)),
                                          max_size=3)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutations=st.lists(mutation_st, min_size=1, max_size=3))
def test_a_malformed_checkpoint_is_refused_or_usable(mutations: Any) -> None:
    blob = _valid_blob()
    for m in mutations:
        if m[0] in ("word", "time"):
            code, buf = ("Q", 1) if m[0] == "word" else ("I", 2)
            a = array(code, blob[4][buf])
            a[m[1] % len(a)] = m[2]
            blob[4][buf] = a.tobytes()
        elif m[0] == "field":
            blob[m[1]] = m[2]
        else:
            blob[2] = m[1]
    try:
        table = DedupTable.restore(60_000, 100, blob)
    except ValueError:
        return
    _usable(table)  # accepted: then it must work, not crash later on the send path


@pytest.mark.timeout(30)
def test_restoring_more_keys_than_a_lowered_bound_fits() -> None:
    """A restart with a lower dedup_entries_max: the checkpoint holds more keys than the new
    bound's slots (1024 for a bound of 100). All rows were placed before the bound was applied, so
    the slots filled up and ``_find`` probed forever (the restore never returned); the bound
    is now kept as the rows are placed."""
    table = DedupTable(60_000, 2000)
    for i in range(2000):
        table.remember(f"k{i}", "t", 0, i, 1000)
    lowered = DedupTable.restore(60_000, 100, table.snapshot())
    assert len(lowered) == 100 and lowered.get("k1999") == ("t", 0, 1999, 1000)


def test_a_run_naming_no_queue_is_refused() -> None:
    """Once accepted: the first lookup of a key in that run raised IndexError on the send path
    (``_row``: ``self._queues[word >> OFFSET_BITS]``). Every run's last row's word is checked now
    (its first offset + length may carry past the queue reference)."""
    blob = _valid_blob()
    words = array("Q", blob[4][1])
    words[0] = 7 << 40  # queue reference 7: the table knows two queues
    blob[4][1] = words.tobytes()
    with pytest.raises(ValueError):
        DedupTable.restore(60_000, 100, blob)


def test_a_newest_time_before_the_epoch_is_refused() -> None:
    """Once accepted: a send stored before the epoch then had a negative time since it, and
    ``_append`` failed with OverflowError (array "I") after appending the row but not its run.
    The runs' times are checked too (non-decreasing, at most newest - epoch): else expire stops
    at the first run whose time is past the horizon and keeps every older key behind it."""
    blob = _valid_blob()
    blob[1] = blob[0] - 10
    with pytest.raises(ValueError):
        DedupTable.restore(60_000, 100, blob)



def test_a_restore_places_every_row_as_the_table_had_it() -> None:
    """The placement within the bound (home slots read in one pass, the probe inline) leaves
    the slots the send path built: keys stored twice (the later row takes the slot), keys
    whose home slots collide (a bound of 40 keys: 128 slots), the count of keys remembered."""
    table = DedupTable(60_000, 40)
    for i in range(30):
        table.remember(f"k{i}", "t", i % 3, i, 1000 + i)
    for i in range(0, 30, 4):  # stored again, elsewhere
        table.remember(f"k{i}", "u", 0, 100 + i, 2000)
    restored = DedupTable.restore(60_000, 40, table.snapshot())
    assert restored._live == table._live == 30
    assert restored._slots == table._slots
    for i in range(31):
        assert restored.get(f"k{i}") == table.get(f"k{i}")
    assert restored.get("k4") == ("u", 0, 104, 2000) and restored.get("k30") is None
