"""Consumer groups' committed offsets kept in rows (``broker.core.offsets.OffsetTable``): the
mapping a dict of (group, topic, queue id) was, key for key (odd keys too: the apply takes what
the log holds), in a fraction of its memory (issue 37: at most 120 bytes per committed offset;
the dict took about 420)."""

from __future__ import annotations

import gc
import random
import tracemalloc

import pytest

from broker.core.entries import OffsetCommit
from broker.core.offsets import OffsetTable
from broker.machine.kinds import encode
from broker.machine.state import BrokerState

GROUPS, QUEUES = 1_000, 40


def test_it_is_the_mapping_a_dict_was_under_any_mix_of_sets_and_deletes() -> None:
    rng = random.Random(7)
    table, model = OffsetTable(), {}
    keys = [(f"g{rng.randrange(5)}", f"t{rng.randrange(3)}", q)
            for q in (0, 1, 2, 7, 1023, 1024, -1, 10**12)]
    for _ in range(5_000):
        key = rng.choice(keys)
        if rng.random() < 0.2 and key in model:
            del table[key], model[key]
        else:
            offset = rng.choice([0, 5, 2**40, -3, 2**63 - 1, 2**63, rng.randrange(10**6)])
            table[key] = model[key] = offset
        assert len(table) == len(model)
    assert dict(table.items()) == model and table == model
    assert table.get(("none", "t0", 0), -1) == -1 and ("none", "t0", 0) not in table
    with pytest.raises(KeyError):
        del table[("none", "t0", 0)]
    assert OffsetTable(table.items()) == table


def test_a_checkpoint_keeps_them_and_a_topic_deleted_takes_its_offsets() -> None:
    state = BrokerState()
    for k, (group, q) in enumerate([("a", 0), ("a", 3), ("b", 1), ("a", 1024)]):
        state.apply(k + 1, 0, encode(OffsetCommit(group, "t", q, 10 + k)))
    again = BrokerState.restore(state.snapshot())
    assert again.offsets == state.offsets and dict(again.offsets.items()) == {
        ("a", "t", 0): 10, ("a", "t", 3): 11, ("b", "t", 1): 12, ("a", "t", 1024): 13}
    assert again.snapshot() == state.snapshot()


def _bytes_per_offset(make: type) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        table = make()
        suffix = "topic"
        for g in range(GROUPS):
            for q in range(QUEUES):  # fresh strings per commit, as a decoded entry's
                table[(f"consumer-group-{g:04d}", "orders-" + suffix, q)] = 1_000_000 + q
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(table) == GROUPS * QUEUES
    return (after - before) / (GROUPS * QUEUES)


def test_a_committed_offset_costs_at_most_120_bytes() -> None:
    rows = _bytes_per_offset(OffsetTable)
    assert rows <= 120, f"{rows:.0f} bytes per offset"
    assert _bytes_per_offset(dict) > 2 * rows  # (what it replaces)
