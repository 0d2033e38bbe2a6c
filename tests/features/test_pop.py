"""Pop consumption's pure part (``broker.features.pop.model``) and its entries applied by the state machine:
receipts, invisibility, acks, FIFO's one-at-a-time rule, dead letters, checkpoints, and a model
check that no acknowledged offset is ever handed out again."""

from __future__ import annotations

import random

import pytest

from broker.core.entries import TopicPut, encode_send
from broker.features.pop.entries import PopAck, PopChange, PopDead, PopEntry
from broker.features.pop.model import INFLIGHT_MAX, PopConflict, PopTable
from broker.machine.kinds import encode
from broker.machine.state import BrokerState

KEY = ("g", "t", 0)
INV = 30_000


def pop(table: PopTable, index: int, now: int, lo: int, hi: int, fresh: list[tuple[int, bool]],
        redeliver: tuple[int, ...] = (), length: int = 100) -> list[tuple[int, int]]:
    return table.pop(KEY, index, now, INV, 0, 0, length, redeliver, lo, hi, fresh)


def test_handed_out_offsets_are_invisible_until_their_time_then_redelivered() -> None:
    t = PopTable()
    assert pop(t, 10, 1000, 0, 3, [(0, False), (2, False)]) == [(0, 1), (2, 1)]  # 1: filtered
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
    pop(t, 5, 0, 0, 2, [(0, False), (1, False)])
    with pytest.raises(PopConflict):
        pop(t, 6, 0, 0, 2, [(0, False)])  # a second leader's plan from the old cursor
    with pytest.raises(PopConflict):
        pop(t, 6, 0, 2, 4, [(5, False)])  # an offset outside the range
    with pytest.raises(PopConflict):
        pop(t, 6, 0, 2, 200, [], length=100)  # past the queue's end
    assert t.get(KEY).cursor == 2  # type: ignore[union-attr]


def test_fifo_one_ordered_message_of_a_queue_in_flight_at_a_time() -> None:
    t = PopTable()
    pop(t, 5, 0, 0, 2, [(0, False), (1, True)])
    with pytest.raises(PopConflict):
        pop(t, 6, 0, 2, 3, [(2, True)])  # the next ordered one waits
    assert pop(t, 6, 0, 2, 3, [(2, False)]) == [(2, 1)]  # an unordered one does not
    t.ack(KEY, 0, [(1, 5)])
    assert pop(t, 7, 0, 3, 4, [(3, True)]) == [(3, 1)]


def test_change_invisible_gives_a_new_epoch_and_dead_removes() -> None:
    t = PopTable()
    pop(t, 5, 0, 0, 1, [(0, False)])
    assert t.change(KEY, 9, 100, 0, 5, 1000)
    assert not t.change(KEY, 10, 100, 0, 5, 1000)  # the old receipt stopped working
    assert [o for o, _ in t.due(KEY, 1100)] == [0]
    assert not t.dead(KEY, 1100, 0, 5) and t.dead(KEY, 1100, 0, 9)
    assert t.get(KEY).committed() == 1  # type: ignore[union-attr]


def test_in_flight_is_bounded() -> None:
    t = PopTable()
    n = INFLIGHT_MAX
    pop(t, 5, 0, 0, n, [(o, False) for o in range(n)], length=n + 1)
    with pytest.raises(PopConflict):
        pop(t, 6, 0, n, n + 1, [(n, False)], length=n + 1)


def _state_with_messages(n: int) -> BrokerState:
    s = BrokerState()
    s.apply(1, 0, encode(TopicPut("t", 1, 1, 6)))
    s.apply(2, 100, encode_send("t", 0, 50, [[b"m%d" % i, "", [], f"k{i}", [], 1] for i in range(n)],
                                False, 4))
    return s


def test_the_state_machine_applies_pops_keeps_offsets_and_survives_a_checkpoint() -> None:
    s = _state_with_messages(4)
    res = s.apply(3, 0, encode(PopEntry(1000, "g", "t", 0, INV, 0, (), 0, 3,
                                            ((0, False), (1, False), (2, False)))))
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
                                             ((0, False),)))).status == "POP_CONFLICT"


def test_a_dead_letter_leaves_flight_and_is_stored_in_one_apply() -> None:
    s = _state_with_messages(1)
    s.apply(3, 0, encode(TopicPut("%DLQ%g", 1, 1, 6, system=True)))
    s.apply(4, 0, encode(PopEntry(1000, "g", "t", 0, INV, 0, (), 0, 1, ((0, False),))))
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
                fresh = [(o, False) for o in range(cursor, hi) if rng.random() < 0.8]
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
    pop(t, 5, 0, 0, 1, [(0, False)])
    assert t.ack(KEY, 0, [(0, 5)]) == [True]
    assert [o for o, _ in t.due(KEY, INV)] == [0]  # it comes back: the checker must see it
