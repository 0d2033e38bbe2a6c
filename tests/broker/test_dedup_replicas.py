"""Review of the dedup table's runs: replicas that apply the same operations hold equal
snapshots, whether one of them restored from its own snapshot at some points or not, and both
answer lookups as a plain model of the table does; a pinned view's bytes stay what
``snapshot()`` gave when it was pinned."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.core.dedup import copy_range
from broker.machine.state import BrokerState
from tests.broker.dedup_model import KEYS, SETTINGS, Replicas, _small, op_st, setup_st


def _pinned(parts: list[list[Any]]) -> list[bytes]:
    """The bytes a pinned view holds now, per field (first rows, words, times, rows)."""
    return [b"".join(p if isinstance(p, bytes) else bytes(copy_range(p)) for p in part)
            for part in parts]


@SETTINGS
@given(setup=setup_st, ops=st.lists(op_st, max_size=60))
def test_replicas_restored_at_any_point_agree_with_a_continuous_one(setup: Any, ops: Any) -> None:
    window, bound, head, clock, (compact_min, slots_min), refs_max = setup
    with _small(compact_min, slots_min, refs_max):
        r = Replicas(window, bound, head, clock)
        r.check()
        for op in ops:
            r.apply(op)
            r.check()


@SETTINGS
@given(setup=setup_st, before=st.lists(op_st, max_size=30), after=st.lists(op_st, max_size=40),
       second=st.integers(0, 40))
def test_a_pinned_view_keeps_the_bytes_it_was_pinned_with(setup: Any, before: Any, after: Any,
                                                          second: int) -> None:
    window, bound, head, clock, (compact_min, slots_min), refs_max = setup
    with _small(compact_min, slots_min, refs_max):
        r = Replicas(window, bound, head, clock)
        for op in before:
            if op[0] not in ("restore", "lower"):
                r.apply(op, (r.a,))
        snap = r.a.snapshot()
        ranges = r.a.pin_rows()
        assert _pinned(ranges) == [*snap[4], snap[5]]
        pins = [(ranges, snap)]
        for j, op in enumerate(after):
            if op[0] in ("restore", "lower"):
                continue
            if j == second:  # a second pin (a digest's) while the first is held
                s2 = r.a.snapshot()
                pins.append((r.a.pin_rows(), s2))
            r.apply(op, (r.a,))
            for key in KEYS:
                assert r.a.get(key) == r.model.get(key)
            for rs, s in pins:
                assert _pinned(rs) == [*s[4], s[5]]
        for _ in pins:
            r.a.unpin_rows()
        with pytest.raises(RuntimeError):
            r.a.unpin_rows()
        for op in after[:10]:  # compaction may run again: the table still answers right
            if op[0] not in ("restore", "lower"):
                r.apply(op, (r.a,))
        for key in KEYS:
            assert r.a.get(key) == r.model.get(key)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(before=st.lists(op_st, max_size=30), after=st.lists(op_st, max_size=30))
def test_a_state_view_iterates_to_the_snapshot_taken_with_it(before: Any, after: Any) -> None:
    with _small(1, 4):
        state = BrokerState()
        cfg = state.config
        r = Replicas(cfg.dedup_window_ms, cfg.dedup_entries_max, 0, 1000)
        r.a = state.dedup
        for op in before:
            if op[0] not in ("restore", "lower"):
                r.apply(op, (state.dedup,))
        want = state.snapshot()
        view = state.snapshot_view()
        for op in after:
            if op[0] not in ("restore", "lower"):
                r.apply(op, (state.dedup,))
        assert b"".join(view) == want
        view.release()
        assert BrokerState.restore(want).snapshot() == want

