"""Pop consumption's pure part (``broker.features.pop.model``) and its entries applied by the state machine:
receipts, invisibility, acks, FIFO's rule per message group (held back, released in order),
dead letters, checkpoints, entries written before per-group FIFO, and model checks that no
acknowledged offset is ever handed out again and that a group's messages go out one at a time,
in order."""

from __future__ import annotations

import random

import cbor2
import pytest

from broker.core.entries import TopicPut, encode_send
from broker.features.pop.entries import KIND_POP, PopAck, PopChange, PopDead, PopEntry
from broker.features.pop.model import INFLIGHT_MAX, WHOLE_QUEUE, PopConflict, PopTable
from broker.machine.kinds import decode, encode
from broker.machine.state import BrokerState
from protocol.broker_errors import BadEntryError

KEY = ("g", "t", 0)
INV = 30_000


def pop(table: PopTable, index: int, now: int, lo: int, hi: int,
        fresh: list[tuple[int, str | None]], redeliver: tuple[int, ...] = (), length: int = 100,
        held: tuple[tuple[int, str], ...] = (), release: tuple[int, ...] = ()
        ) -> list[tuple[int, int]]:
    return table.pop(KEY, index, now, INV, 0, 0, length, redeliver, lo, hi, fresh, release, held)


def test_handed_out_offsets_are_invisible_until_their_time_then_redelivered() -> None:
    t = PopTable()
    assert pop(t, 10, 1000, 0, 3, [(0, None), (2, None)]) == [(0, 1), (2, 1)]  # 1: filtered
    q = t.get(KEY)
    assert q is not None and q.cursor == 3 and q.committed() == 0
    assert t.due(KEY, 1000 + INV - 1) == []
    assert [o for o, _ in t.due(KEY, 1000 + INV)] == [0, 2]
    with pytest.raises(PopConflict):
        pop(t, 11, 1000 + INV - 1, 3, 3, [], redeliver=(0,))  # not due yet
    assert pop(t, 11, 1000 + INV, 3, 3, [], redeliver=(0,)) == [(0, 2)]  # attempt 2
    assert t.ack(KEY, 1000 + INV, [(0, 10)]) == [False]  # the first receipt is stale now
    assert t.ack(KEY, 1000 + INV, [(0, 11), (2, 10)]) == [True, True]
    assert t.ack(KEY, 1000 + INV, [(0, 11)]) == [True]  # a retried ack: the same answer
    assert q.committed() == 3 and not q.inflight


def test_a_pop_planned_on_a_stale_cursor_is_refused_whole() -> None:
    t = PopTable()
    pop(t, 5, 0, 0, 2, [(0, None), (1, None)])
    with pytest.raises(PopConflict):
        pop(t, 6, 0, 0, 2, [(0, None)])  # a second leader's plan from the old cursor
    with pytest.raises(PopConflict):
        pop(t, 6, 0, 2, 4, [(5, None)])  # an offset outside the range
    with pytest.raises(PopConflict):
        pop(t, 6, 0, 2, 200, [], length=100)  # past the queue's end
    assert t.get(KEY).cursor == 2  # type: ignore[union-attr]


def test_fifo_one_message_of_a_group_in_flight_at_a_time_other_groups_in_parallel() -> None:
    t = PopTable()
    # A0 and B0 go out together; A1 waits behind A0 (held back), B1 behind B0, C0 goes
    assert pop(t, 5, 0, 0, 5, [(0, "A"), (1, "B"), (4, "C")], held=((2, "A"), (3, "B"))) \
        == [(0, 1), (1, 1), (4, 1)]
    q = t.get(KEY)
    assert q is not None and q.held == {2: "A", 3: "B"} and q.cursor == 5 and q.committed() == 0
    with pytest.raises(PopConflict, match="busy"):
        pop(t, 6, 0, 5, 6, [(5, "A")])  # the next of A while A0 is in flight
    with pytest.raises(PopConflict, match="busy"):
        pop(t, 6, 0, 5, 5, [], release=(2,))  # A1 released while A0 is in flight
    # an unordered one never waits; D held back though nothing of D is before it (as a plan
    # an ack overtook): it waits for the next pop
    assert pop(t, 6, 0, 5, 7, [(5, None)], held=((6, "D"),)) == [(5, 1)]
    assert t.releasable(KEY) == [6]
    assert pop(t, 7, 0, 7, 7, [], release=(6,)) == [(6, 1)]
    assert t.releasable(KEY) == []
    t.ack(KEY, 0, [(0, 5)])
    assert t.releasable(KEY) == [2]  # A1 may go now, B1 still waits for B0
    assert q.committed() == 1
    with pytest.raises(PopConflict, match="busy"):
        pop(t, 8, 0, 7, 8, [(7, "A")])  # a later A may not pass the A held back
    assert pop(t, 8, 0, 7, 8, [], held=((7, "A"),), release=(2,)) == [(2, 1)]
    assert q.held == {3: "B", 7: "A"} and q.inflight[2].group == "A"


def test_held_offsets_are_released_lowest_first_and_one_per_group() -> None:
    t = PopTable()
    pop(t, 5, 0, 0, 3, [(0, "A")], held=((1, "A"), (2, "A")))
    t.ack(KEY, 0, [(0, 5)])
    with pytest.raises(PopConflict, match="busy"):
        pop(t, 6, 0, 3, 3, [], release=(2,))  # not the lowest of A
    with pytest.raises(PopConflict, match="busy"):
        pop(t, 6, 0, 3, 3, [], release=(1, 2))  # two of A at once
    with pytest.raises(PopConflict, match="not held"):
        pop(t, 6, 0, 3, 3, [], release=(0,))
    assert pop(t, 6, 0, 3, 3, [], release=(1,)) == [(1, 1)]
    assert t.ack(KEY, 0, [(2, 5)]) == [False]  # a held offset is not acknowledged already
    t.dead(KEY, 0, 1, 6)  # a dead letter frees the group too
    assert t.releasable(KEY) == [2]


def test_the_bound_counts_the_offsets_held_back() -> None:
    t = PopTable()
    n = INFLIGHT_MAX
    pop(t, 5, 0, 0, n, [(0, "A")], held=tuple((o, "A") for o in range(1, n)), length=n + 1)
    with pytest.raises(PopConflict, match="held back"):
        pop(t, 6, 0, n, n + 1, [(n, None)], length=n + 1)


def test_an_ordered_offset_of_an_entry_that_names_no_group_holds_back_the_whole_queue() -> None:
    """Entries written before per-group FIFO (``[offset, true]``) keep the rule they were planned
    under: one ordered message of the queue in flight at a time."""
    s = _state_with_messages(4)
    legacy = cbor2.dumps([1, KIND_POP, 1000, "g", "t", 0, INV, 0, [], 0, 2, [[0, False], [1, True]]])
    e = decode(legacy)
    assert e.fresh == ((0, None), (1, WHOLE_QUEUE)) and e.held == () and e.release == ()
    assert s.apply(3, 0, legacy).status == "OK"
    for index, group in ((4, "A"), (5, WHOLE_QUEUE)):
        res = s.apply(index, 0, encode(PopEntry(1001, "g", "t", 0, INV, 0, (), 2, 3,
                                                ((2, group),))))
        assert res.status == "POP_CONFLICT"
    gate = s.pops.gate(KEY)
    assert not gate.free("A") and not gate.free("B")
    assert s.apply(6, 0, encode(PopEntry(1002, "g", "t", 0, INV, 0, (), 2, 4, ((3, None),),
                                         ((2, "A"),)))).status == "OK"
    # the checkpoint's form before per-group FIFO: [offset, epoch, attempt, visible, ordered]
    old = PopTable.restore([5, [["g", "t", 0, 2, [[1, 3, 1, 9, True], [0, 3, 1, 9, False]]]]])
    assert old.get(KEY).inflight[1].group == WHOLE_QUEUE  # type: ignore[union-attr]
    assert old.get(KEY).inflight[0].group is None  # type: ignore[union-attr]


def test_a_pop_without_groups_is_written_in_the_form_before_per_group_fifo() -> None:
    """So that a replica not upgraded yet applies it the same (a rolling upgrade)."""
    plain = PopEntry(1000, "g", "t", 0, INV, 0, (3,), 4, 6, ((4, None), (5, None)))
    assert cbor2.loads(encode(plain)) == [1, KIND_POP, 1000, "g", "t", 0, INV, 0, [3], 4, 6,
                                          [[4, False], [5, False]]]
    assert decode(encode(plain)) == plain
    fifo = PopEntry(1000, "g", "t", 0, INV, 0, (), 4, 6, ((4, "A"),), ((5, "A"),))
    assert len(cbor2.loads(encode(fifo))) == 14 and decode(encode(fifo)) == fifo


@pytest.mark.parametrize("fields", [
    [1000, "g", "t", 0, INV, 0, [], 0, 2, [[0, 7]]],  # a group neither a string nor a bool
    [1000, "g", "t", 0, INV, 0, [], 0, 2, [[0, "A"]], [[1, False]], []],  # a held one's group
    [1000, "g", "t", 0, INV, 0, [], 0, 2, [[0, "A"]], []],  # held without released
])
def test_a_malformed_pop_entry_is_refused_by_name(fields: list[object]) -> None:
    with pytest.raises(BadEntryError, match="malformed entry of kind 12"):
        decode(cbor2.dumps([1, KIND_POP, *fields]))


def test_change_invisible_gives_a_new_epoch_and_dead_removes() -> None:
    t = PopTable()
    pop(t, 5, 0, 0, 1, [(0, None)])
    assert t.change(KEY, 9, 100, 0, 5, 1000)
    assert not t.change(KEY, 10, 100, 0, 5, 1000)  # the old receipt stopped working
    assert [o for o, _ in t.due(KEY, 1100)] == [0]
    assert not t.dead(KEY, 1100, 0, 5) and t.dead(KEY, 1100, 0, 9)
    assert t.get(KEY).committed() == 1  # type: ignore[union-attr]


def test_in_flight_is_bounded() -> None:
    t = PopTable()
    n = INFLIGHT_MAX
    pop(t, 5, 0, 0, n, [(o, None) for o in range(n)], length=n + 1)
    with pytest.raises(PopConflict):
        pop(t, 6, 0, n, n + 1, [(n, None)], length=n + 1)


def _state_with_messages(n: int) -> BrokerState:
    s = BrokerState()
    s.apply(1, 0, encode(TopicPut("t", 1, 1, 6)))
    s.apply(2, 100, encode_send("t", 0, 50, [[b"m%d" % i, "", [], f"k{i}", [], 1] for i in range(n)],
                                False, 4))
    return s


def test_the_state_machine_applies_pops_keeps_offsets_and_survives_a_checkpoint() -> None:
    s = _state_with_messages(4)
    res = s.apply(3, 0, encode(PopEntry(1000, "g", "t", 0, INV, 0, (), 0, 3,
                                            ((0, None), (1, None), (2, None)))))
    assert res.status == "OK" and res.popped == ((0, 1), (1, 1), (2, 1))
    res = s.apply(4, 0, encode(PopAck(1001, "g", "t", 0, ((0, 3), (1, 99)))))
    assert res.acked == (True, False)
    assert s.offsets[KEY] == 1
    assert s.apply(5, 0, encode(PopChange(1002, "g", "t", 0, 1, 3, 5000))).status == "OK"
    assert s.apply(6, 0, encode(PopChange(1002, "g", "t", 0, 1, 3, 5000))).status \
        == "INVALID_RECEIPT_HANDLE"
    again = BrokerState.restore(s.snapshot())
    assert again.pops == s.pops and again.offsets == s.offsets
    # a conflicting pop (planned from the old cursor) is refused alike on every replica
    assert s.apply(7, 0, encode(PopEntry(1003, "g", "t", 0, INV, 0, (), 0, 1,
                                             ((0, None),)))).status == "POP_CONFLICT"


def test_a_dead_letter_leaves_flight_and_is_stored_in_one_apply() -> None:
    s = _state_with_messages(1)
    s.apply(3, 0, encode(TopicPut("%DLQ%g", 1, 1, 6, system=True)))
    s.apply(4, 0, encode(PopEntry(1000, "g", "t", 0, INV, 0, (), 0, 1, ((0, None),))))
    copy = [b"m0", "", [], "k0#x", [["RETRY_TOPIC", "t"]], 1]
    res = s.apply(5, 500, encode(PopDead(2000, "g", "t", 0, 0, 4, "%DLQ%g", copy)))
    assert res.status == "OK" and s.queue_range("%DLQ%g", 0) == (0, 1)
    again = s.apply(6, 600, encode(PopDead(2000, "g", "t", 0, 0, 4, "%DLQ%g", copy)))
    assert again.status == "INVALID_RECEIPT_HANDLE" and s.queue_range("%DLQ%g", 0) == (0, 1)


def test_model_no_acknowledged_offset_is_handed_out_again() -> None:
    """Random pops, acks, changes and expiries against a model: every offset acknowledged is
    never popped again, and every offset below the cursor is in flight or was acknowledged."""
    rng = random.Random(7)
    for seed in range(30):
        rng.seed(seed)
        t = PopTable()
        now, index, length = 0, 1, 60
        acked: set[int] = set()
        receipts: dict[int, int] = {}  # offset -> the epoch of its latest receipt
        for _ in range(300):
            index += 1
            now += rng.choice((0, 10, 1000, INV))
            op = rng.random()
            q = t.get(KEY)
            cursor = q.cursor if q else 0
            if op < 0.4:
                due = [o for o, _ in t.due(KEY, now)][: rng.randint(0, 3)]
                hi = min(length, cursor + rng.randint(0, 4))
                fresh = [(o, None) for o in range(cursor, hi) if rng.random() < 0.8]
                try:
                    out = t.pop(KEY, index, now, INV, 0, 0, length, due, cursor, hi, fresh)
                except PopConflict:
                    continue
                for off, _ in out:
                    assert off not in acked, f"seed {seed}: acknowledged {off} handed out again"
                    receipts[off] = index
                acked.update(o for o in range(cursor, hi) if o not in dict(fresh))  # filtered
            elif op < 0.8 and receipts:
                off = rng.choice(sorted(receipts))
                if t.ack(KEY, now, [(off, receipts[off])]) == [True]:
                    acked.add(off)
            elif receipts:
                off = rng.choice(sorted(receipts))
                if t.change(KEY, index, now, off, receipts[off], rng.choice((1000, INV))):
                    receipts[off] = index
            q = t.get(KEY)
            if q is not None:
                for off in range(q.cursor):
                    assert off in q.inflight or off in acked, f"seed {seed}: {off} lost"


def test_the_canary_answers_an_ack_but_keeps_the_message_in_flight() -> None:
    t = PopTable(frozenset({"pop_ack_lost"}))
    pop(t, 5, 0, 0, 1, [(0, None)])
    assert t.ack(KEY, 0, [(0, 5)]) == [True]
    assert [o for o, _ in t.due(KEY, INV)] == [0]  # it comes back: the checker must see it


def _plan_and_pop(t: PopTable, rng: random.Random, index: int, now: int, groups: list[str | None],
                  ) -> list[tuple[int, int]]:
    """One receive planned as the leader plans it (``broker.features.pop.service``): due
    redeliveries, the releasable held-back offsets, then a scan from the cursor that hands out
    what its group lets go and holds back the rest."""
    q = t.get(KEY)
    cursor = q.cursor if q else 0
    due = [o for o, _ in t.due(KEY, now)][: rng.randint(0, 2)]
    release = t.releasable(KEY)[: rng.randint(0, 2)]
    gate = t.gate(KEY)
    fresh: list[tuple[int, str | None]] = []
    held: list[tuple[int, str]] = []
    hi = cursor
    for off in range(cursor, min(len(groups), cursor + rng.randint(0, 5))):
        group = groups[off]
        if group is not None and not gate.free(group):
            held.append((off, group))
            continue
        if rng.random() < 0.9:  # (else filtered out: skipped)
            fresh.append((off, group))
            if group is not None:
                gate.take(group)
        hi = off + 1
    held = [(o, g) for o, g in held if o < hi]
    return t.pop(KEY, index, now, INV, 0, 0, len(groups), due, cursor, hi, fresh, release, held)


def _fifo_run(seed: int, canaries: frozenset[str] = frozenset()) -> list[str]:
    """Random receives, acks, expiries and dead letters over a queue of three message groups
    and unordered messages; the FIFO violations seen (two of a group in flight, or a group's
    messages first handed out out of order) and any acknowledged offset handed out again."""
    rng = random.Random(seed)
    groups = [rng.choice(["A", "B", "C", None]) for _ in range(80)]
    t = PopTable(canaries)
    now, index = 0, 1
    acked: set[int] = set()
    receipts: dict[int, int] = {}
    first_out: dict[str, list[int]] = {}
    problems = []
    for _ in range(400):
        index += 1
        now += rng.choice((0, 10, 1000, INV))
        op = rng.random()
        if op < 0.45:
            try:
                out = _plan_and_pop(t, rng, index, now, groups)
            except PopConflict as err:
                problems.append(f"the planner's pop was refused: {err}")
                continue
            for off, attempt in out:
                if off in acked:
                    problems.append(f"acknowledged {off} handed out again")
                receipts[off] = index
                group = groups[off]
                if attempt == 1 and group is not None:
                    first_out.setdefault(group, []).append(off)
        elif op < 0.85 and receipts:
            off = rng.choice(sorted(receipts))
            if t.ack(KEY, now, [(off, receipts.pop(off))]) == [True]:
                acked.add(off)
        elif receipts:
            off = rng.choice(sorted(receipts))
            if t.dead(KEY, now, off, receipts[off]):
                acked.add(off)
                del receipts[off]
        q = t.get(KEY)
        if q is not None:
            flying = [f.group for f in q.inflight.values() if f.group is not None]
            if len(flying) != len(set(flying)):
                problems.append(f"two of one group in flight: {sorted(flying)}")
    problems += [f"group {g} handed out {offs}" for g, offs in first_out.items()
                 if offs != sorted(offs)]
    return problems


def test_model_a_group_goes_out_one_at_a_time_in_order() -> None:
    for seed in range(30):
        assert _fifo_run(seed) == [], f"seed {seed}"


def test_the_overlap_canary_hands_out_a_group_while_its_message_is_in_flight() -> None:
    found = [p for seed in range(10) for p in _fifo_run(seed, frozenset({"fifo_group_overlap"}))]
    assert any("two of one group in flight" in p for p in found)
