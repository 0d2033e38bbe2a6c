"""Delayed and timed messages, the pure part (``broker.features.delay.model``) and the state
machine's use of it: the levels, the leader's rewrite, the index of pending timers (bounded bytes
per timer, the same snapshot on every replica), schedule and delivery entries (a timer delivered
once however many deliveries name it; the canary that stores it again), recalls (a recalled timer
never delivered), checkpoints with timers; a delayed send's topic created by the send, not by the
delivery."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.entries import encode_runs
from broker.core.sendwire import run_answers
from broker.core.state import StateConfig
from broker.features.delay.apply import NOT_RECALLABLE
from broker.features.delay.entries import TimerDeliver, TimerRecall
from broker.features.delay.model import (
    BUCKET_MS,
    DEFAULT_LEVELS,
    RECORD,
    SCHEDULE_TOPIC,
    DelayError,
    DelayIndex,
    due_of,
    parse_levels,
    route_run,
    timer_of,
)
from broker.features.delay.service import MAX_WAIT_S, look_again_s
from broker.machine.kinds import decode, encode, stored_messages
from broker.machine.state import BrokerState

LEVELS = parse_levels(DEFAULT_LEVELS)
WEEK_MS = 7 * 24 * 3600 * 1000


def test_the_default_levels_are_rocketmqs_eighteen() -> None:
    assert len(LEVELS) == 18
    assert LEVELS[:4] == (1000, 5000, 10_000, 30_000)
    assert LEVELS[-3:] == (1_800_000, 3_600_000, 7_200_000)
    assert parse_levels("250ms 2s 1d") == (250, 2000, 86_400_000)
    for bad in ("", "5", "1x", "0s", "-1s", "s"):
        with pytest.raises(DelayError):
            parse_levels(bad)


def test_only_a_leader_that_may_deliver_looks_again_at_once() -> None:
    # Found by the live chaos features (S6): a new leader not caught up yet, with a timer
    # overdue, looked again at once, found it could not deliver, and did so for ever without
    # awaiting anything: its event loop never applied its term's first entry and it froze.
    assert look_again_s(False, 100, 500.0, stuck=False) == MAX_WAIT_S  # not caught up: the period
    assert look_again_s(True, 100, 500.0, stuck=False) == 0.0  # overdue: at once
    assert look_again_s(True, 100, 500.0, stuck=True) == MAX_WAIT_S  # overdue, undeliverable
    assert look_again_s(True, 700, 500.0, stuck=True) == pytest.approx(0.2)  # until it is due
    assert look_again_s(True, 10_000, 500.0, stuck=False) == MAX_WAIT_S
    assert look_again_s(True, None, 500.0, stuck=False) == MAX_WAIT_S  # nothing pending


def test_due_times_from_levels_and_timer_properties() -> None:
    now = 1_000_000
    assert due_of([], now, LEVELS, WEEK_MS) is None
    assert due_of([["a", "b"]], now, LEVELS, WEEK_MS) is None
    assert due_of([["DELAY", "0"]], now, LEVELS, WEEK_MS) is None  # level 0: not delayed
    assert due_of([["DELAY", "3"]], now, LEVELS, WEEK_MS) == now + 10_000
    assert due_of([["DELAY", "99"]], now, LEVELS, WEEK_MS) == now + 7_200_000  # capped at 18
    assert due_of([["TIMER_DELAY_MS", "1500"]], now, LEVELS, WEEK_MS) == now + 1500
    assert due_of([["TIMER_DELAY_SEC", "2"]], now, LEVELS, WEEK_MS) == now + 2000
    assert due_of([["TIMER_DELIVER_MS", str(now + 5)]], now, LEVELS, WEEK_MS) == now + 5
    assert due_of([["TIMER_DELIVER_MS", "5"]], now, LEVELS, WEEK_MS) == now  # past: due now
    for bad in ([["DELAY", "x"]], [["DELAY", "-1"]], [["TIMER_DELAY_MS", "1.5"]],
                [["TIMER_DELAY_MS", str(WEEK_MS + 1)]], [["DELAY", "1"], ["TIMER_DELAY_MS", "1"]],
                [["TIMER_DELIVER_MS", "9" * 30]]):
        with pytest.raises(DelayError):
            due_of(bad, now, LEVELS, WEEK_MS)


def m(body: bytes, *props: list[str], key: str = "") -> list:
    return [body, "", [], key, [list(p) for p in props], 0]


def test_the_leader_rewrites_delayed_runs_and_refuses_batches_and_mixed_runs() -> None:
    plain = [m(b"a"), m(b"b", ["x", "1"])]
    assert route_run("t", 2, plain, 0, LEVELS, WEEK_MS, batch=False) == ("t", 2, plain)
    topic, qid, out = route_run("t", 2, [m(b"a", ["DELAY", "1"], ["x", "1"])], 50, LEVELS,
                                WEEK_MS, batch=False)
    assert (topic, qid) == (SCHEDULE_TOPIC, 0)
    assert dict(map(tuple, out[0][4])) == {"DELAY": "1", "x": "1", "REAL_TOPIC": "t",
                                          "REAL_QID": "2", "TIMER_DELIVER_MS": "1050"}
    assert timer_of(out[0]) == ("t", 2, 1050)
    with pytest.raises(DelayError, match="batch"):
        route_run("t", 0, [m(b"a", ["DELAY", "1"])], 0, LEVELS, WEEK_MS, batch=True)
    with pytest.raises(DelayError, match="mixes"):
        route_run("t", 0, [m(b"a", ["DELAY", "1"]), m(b"b", ["y", "2"])], 0, LEVELS, WEEK_MS,
                  batch=False)
    with pytest.raises(ValueError):
        timer_of(m(b"forged", ["REAL_TOPIC", "t"]))  # what a replica refuses


def test_the_index_gives_due_timers_earliest_first_and_takes_each_once() -> None:
    index = DelayIndex()
    for offset, due in enumerate([5000, 1000, 25_000, 1000, 999]):
        index.add(due, offset)
    assert len(index) == 5 and index.next_due_ms() == 999
    assert index.due(1000, 10) == [(999, 4), (1000, 1), (1000, 3)]
    assert index.due(1000, 2) == [(999, 4), (1000, 1)]
    assert index.due(1000, 10, skip={1}) == [(999, 4), (1000, 3)]
    assert index.due(998, 10) == []
    assert index.take(1, 1000) and not index.take(1, 1000)  # once
    assert not index.take(0, 1000)  # not scheduled at that time
    assert index.due(30_000, 10) == [(999, 4), (1000, 3), (5000, 0), (25_000, 2)]
    for offset, due in [(4, 999), (3, 1000), (0, 5000), (2, 25_000)]:
        assert index.take(offset, due)
    assert len(index) == 0 and index.next_due_ms() is None and index.snapshot() == []


ops = st.lists(st.one_of(st.tuples(st.just("add"), st.integers(0, 5 * BUCKET_MS)),
                         st.tuples(st.just("take"), st.integers(0, 40))), max_size=60)


@given(ops, st.integers(0, 60))
@settings(max_examples=200, deadline=None)
def test_a_restored_index_and_a_live_one_agree_forever(script, cut: int) -> None:
    """Replicas that restored a checkpoint at any point, and one that never did, hold the same
    pending timers and give the same snapshots (bucket order, record order)."""
    live = DelayIndex()
    dues: dict[int, int] = {}
    restored: DelayIndex | None = None
    for step, (op, value) in enumerate(script):
        if step == cut:
            restored = DelayIndex.restore(live.snapshot())
        targets = [live] + ([restored] if restored is not None else [])
        if op == "add":
            offset = len(dues)
            dues[offset] = value
            for index in targets:
                index.add(value, offset)
        else:
            took = {index.take(value, dues.get(value, 0)) for index in targets}
            assert len(took) == 1
    if restored is not None:
        assert restored.snapshot() == live.snapshot() and len(restored) == len(live)
        assert restored.due(10**9, 100) == live.due(10**9, 100)


def test_pending_timers_cost_sixteen_bytes_each_and_no_object_per_timer() -> None:
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    index = DelayIndex()
    n = 200_000
    for k in range(n):  # spread over a week: many buckets, as arbitrary times would be
        index.add(k * (WEEK_MS // n), k)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert RECORD.size == 16
    buckets = len(index.snapshot())
    assert buckets <= WEEK_MS // BUCKET_MS + 1
    # 16 bytes a timer plus a bucket's dict slot and buffer: a million timers due over a week
    # need at most 16 MB + 60,480 buckets x 200 B = 28 MB
    assert grown <= 16 * n + 200 * buckets, f"{grown} bytes for {n} timers in {buckets} buckets"


# -- the state machine ----------------------------------------------------------------------------

class Replica:
    def __init__(self, state: BrokerState | None = None) -> None:
        self.state = state or BrokerState()
        self.index = self.state.applied_index
        self.position = 0

    def apply_bytes(self, data: bytes):
        self.index += 1
        result = self.state.apply(self.index, self.position, data)
        self.position += 48 + len(data)
        return result


def schedule_entry(ts: int, *messages: tuple[str, int, list], auto_create: bool = True) -> bytes:
    """The leader's entry for delayed sends: one schedule run of rewritten messages."""
    rewritten = []
    for topic, qid, msg in messages:
        _, _, out = route_run(topic, qid, [msg], ts, LEVELS, WEEK_MS, batch=False)
        rewritten += out
    return encode_runs(ts, [[SCHEDULE_TOPIC, 0, rewritten, auto_create, 4]])


def deliver(state: BrokerState, replica: Replica, now_ms: int):
    """What the delay service proposes: every due timer with its message copy."""
    items = []
    for due, offset in state.timers.due(now_ms, 1000):
        unit = state.queues[(SCHEDULE_TOPIC, 0)][offset]
        msg = stored_messages(replica_entries[unit.position])[unit.slot]
        topic, qid, _ = timer_of(msg)
        items.append((offset, due, topic, qid, msg))
    return TimerDeliver(now_ms, tuple(items), True, 4)


replica_entries: dict[int, bytes] = {}


def apply(replica: Replica, data: bytes):
    replica_entries[replica.position] = data
    return replica.apply_bytes(data)


def test_a_delayed_send_waits_in_the_index_and_is_delivered_once_into_its_queue() -> None:
    r = Replica()
    res = apply(r, schedule_entry(1000, ("t", 1, m(b"late", ["DELAY", "2"], key="K1")),
                                  ("t", 3, m(b"later", ["TIMER_DELAY_MS", "60000"], key="K2"))))
    run = res.run_results()[0]
    assert run.status == "SEND_OK" and run.queue_ids == (1, 3)
    answer = run_answers("g", 0, res)[0]
    assert answer[1] == 1 and answer[2] == [-1, -1] and answer[5] == [1, 3]
    assert len(r.state.timers) == 2 and r.state.queue_range("t", 1) == (0, 0)
    # a retried send of the same unique key is a duplicate: no second timer
    dup = apply(r, schedule_entry(1500, ("t", 2, m(b"late", ["DELAY", "2"], key="K1"))))
    assert dup.run_results()[0].duplicates == (True,) and dup.run_results()[0].queue_ids == (1,)
    assert len(r.state.timers) == 2
    early = deliver(r.state, r, 5999)
    assert early.items == ()  # nothing due before 1000 + 5 s
    first = deliver(r.state, r, 6000)
    assert [i[2:4] for i in first.items] == [("t", 1)]
    apply(r, encode(first))
    assert r.state.queue_range("t", 1) == (0, 1) and len(r.state.timers) == 1
    apply(r, encode(first))  # the same delivery again (a second leader): stores nothing
    assert r.state.queue_range("t", 1) == (0, 1)
    unit = r.state.units("t", 1, 0, 1)[0]
    assert unit.store_ts_ms == 6000 and unit.size == len(b"late")


def test_a_delayed_sends_topic_exists_from_the_send_on() -> None:
    # issue 34 item 21: the real topic was created only when the message was delivered, so a
    # consumer started meanwhile found no topic (TopicNotFoundError)
    r = Replica()
    apply(r, schedule_entry(1000, ("fresh", 1, m(b"later", ["DELAY", "3"]))))
    cfg = r.state.topics["fresh"]
    assert (cfg.read_queues, cfg.write_queues, cfg.perm) == (4, 4, 6)
    assert r.state.queue_range("fresh", 1) == (0, 0)  # exists, and holds nothing yet
    apply(r, encode(deliver(r.state, r, 11_000)))
    assert r.state.queue_range("fresh", 1) == (0, 1)
    # a leader that does not auto-create topics leaves it to the delivery (which drops it)
    off = Replica()
    apply(off, schedule_entry(1000, ("other", 0, m(b"x", ["DELAY", "1"])), auto_create=False))
    assert "other" not in off.state.topics and len(off.state.timers) == 1


def test_the_redeliver_canary_stores_a_delivered_timer_again() -> None:
    r = Replica(BrokerState(StateConfig(canaries=frozenset({"timer_redeliver"}))))
    apply(r, schedule_entry(1000, ("t", 0, m(b"x", ["DELAY", "1"]))))
    d = deliver(r.state, r, 2000)
    apply(r, encode(d))
    apply(r, encode(d))
    assert r.state.queue_range("t", 0) == (0, 2)


def test_the_recall_ignored_canary_answers_a_recall_and_delivers_the_message_all_the_same() -> None:
    r = Replica(BrokerState(StateConfig(canaries=frozenset({"recall_ignored"}))))
    apply(r, schedule_entry(1000, ("t", 0, m(b"x", ["DELAY", "1"], key="X"))))
    (due, offset), = r.state.timers.due(10_000, 10)
    assert apply(r, encode(TimerRecall(1500, offset, due, "t", "X"))).status == "OK"
    apply(r, encode(deliver(r.state, r, 3000)))  # the timer was left pending: delivered
    assert r.state.queue_range("t", 0) == (0, 1)


def test_a_forged_schedule_run_is_refused_alike_and_checkpoints_keep_the_timers() -> None:
    r = Replica()
    forged = encode_runs(1, [[SCHEDULE_TOPIC, 0, [m(b"x", ["REAL_TOPIC", "t"])], True, 4]])
    assert apply(r, forged).run_results()[0].status == "BAD_ENTRY"
    apply(r, schedule_entry(1000, ("t", 0, m(b"a", ["DELAY", "1"], key="A")),
                            ("u", 0, m(b"b", ["DELAY", "18"], key="B"))))
    restored = BrokerState.restore(r.state.snapshot())
    assert restored.timers == r.state.timers and len(restored.timers) == 2
    assert restored.snapshot() == r.state.snapshot()
    d = deliver(r.state, r, 2000)
    twin = Replica(restored)
    twin.index, twin.position = r.index, r.position
    apply(r, encode(d))
    apply(twin, encode(d))
    assert twin.state.snapshot() == r.state.snapshot()


def test_a_recalled_timer_is_never_delivered_and_a_delivered_one_cannot_be_recalled() -> None:
    """RocketMQ 5.x's recall (issue 35): a TIMER_RECALL entry takes a pending timer out of the
    index, so no delivery stores it, on any replica and after a checkpoint; once delivered (or
    recalled) a recall is NOT_RECALLABLE. Whichever of the two is applied first wins."""
    r = Replica()
    apply(r, schedule_entry(1000, ("t", 0, m(b"kept", ["DELAY", "1"], key="K")),
                            ("t", 0, m(b"recalled", ["DELAY", "1"], key="R"))))
    due = {k: d for d, k in r.state.timers.due(10_000, 10)}  # schedule offset -> due
    assert sorted(due) == [0, 1]
    recall = TimerRecall(1500, 1, due[1], "t", "R")
    assert decode(encode(recall)) == recall
    in_flight = deliver(r.state, r, 3000)  # a delivery proposed before the recall was applied
    assert [i[0] for i in in_flight.items] == [0, 1]
    assert apply(r, encode(recall)).status == "OK"
    assert [o for _, o in r.state.timers.due(10_000, 10)] == [0]
    restored = Replica(BrokerState.restore(r.state.snapshot()))  # the recall kept by a checkpoint
    restored.index, restored.position = r.index, r.position
    for replica in (r, restored):
        apply(replica, encode(in_flight))  # the recalled timer is skipped
        assert [u.size for u in replica.state.units("t", 0, 0, 10)] == [len(b"kept")]
    assert restored.state.snapshot() == r.state.snapshot()
    again = apply(r, encode(recall))  # recalled already
    late = apply(r, encode(TimerRecall(3500, 0, due[0], "t", "K")))  # delivered already
    assert again.status == late.status == NOT_RECALLABLE
    assert "not pending" in late.detail
