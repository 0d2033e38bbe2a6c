"""The broker's state machine: offsets assigned at apply in log order, dense per queue, the same
on every replica; topics; permissions; dedup of retried sends; checkpoints."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.entries import (
    Message,
    OffsetCommit,
    SendEntry,
    SendRun,
    SendRunsEntry,
    TopicDelete,
    TopicPut,
)
from broker.core.state import StateConfig
from broker.machine.kinds import decode, encode
from broker.machine.state import BrokerState
from protocol.broker_errors import BadEntryError, InvalidTopicError
from protocol.topics import PERM_READ, PERM_RW, PERM_WRITE, validate_topic_name


class Log:
    """Applies entries as a replica would: increasing index, positions as the commitlog's."""

    def __init__(self, state: BrokerState | None = None) -> None:
        self.state = state or BrokerState()
        self.index = self.state.applied_index
        self.position = 0

    def apply(self, entry) -> object:
        data = encode(entry)
        self.index += 1
        result = self.state.apply(self.index, self.position, data)
        self.position += 48 + len(data)
        return result


def send(topic: str, queue_id: int, *bodies: bytes, keys: tuple[str, ...] = (), ts: int = 1000,
         auto: bool = True) -> SendEntry:
    msgs = tuple(Message(b, unique_key=keys[i] if i < len(keys) else "") for i, b in enumerate(bodies))
    return SendEntry(topic, queue_id, ts, msgs, auto_create=auto)


def test_queue_offsets_are_dense_per_queue_and_follow_log_order() -> None:
    log = Log()
    r1 = log.apply(send("orders", 0, b"a"))
    r2 = log.apply(send("orders", 1, b"b"))
    r3 = log.apply(send("orders", 0, b"c", b"d", b"e"))  # a batch: consecutive offsets
    assert (r1.status, r1.queue_offsets) == ("SEND_OK", (0,))
    assert r2.queue_offsets == (0,)
    assert r3.queue_offsets == (1, 2, 3)
    units = log.state.units("orders", 0, 0, 10)
    assert [u.slot for u in units] == [0, 0, 1, 2]
    assert log.state.queue_range("orders", 0) == (0, 4)


def test_offset_at_finds_the_first_message_stored_at_or_after_a_time() -> None:
    log = Log()
    for ts, body in ((1000, b"a"), (2000, b"b"), (2000, b"c"), (3000, b"d")):
        log.apply(send("orders", 0, body, ts=ts))
    at = log.state.offset_at
    assert [at("orders", 0, t) for t in (0, 1000, 1001, 2000, 2500, 3000)] == [0, 0, 1, 1, 3, 3]
    assert at("orders", 0, 3001) == 4  # nothing that recent: the max offset
    assert at("orders", 1, 0) == 0 and at("nope", 0, 5) == 0  # an empty or unknown queue


def test_auto_create_makes_four_queues_and_can_be_off() -> None:
    log = Log()
    assert log.apply(send("t1", 3, b"x")).status == "SEND_OK"
    assert log.state.topics["t1"].write_queues == 4
    assert log.apply(send("t2", 0, b"x", auto=False)).status == "TOPIC_NOT_FOUND"
    assert "t2" not in log.state.topics


def test_permissions_and_queue_counts_are_enforced() -> None:
    log = Log()
    log.apply(TopicPut("ro", 4, 4, PERM_READ))
    assert log.apply(send("ro", 0, b"x")).status == "NO_PERMISSION"
    log.apply(TopicPut("w", 2, 8, PERM_WRITE))
    assert log.apply(send("w", 7, b"x")).status == "SEND_OK"
    assert log.apply(send("w", 8, b"x")).status == "QUEUE_NOT_FOUND"
    assert log.state.topics["w"].queues == 8
    log.apply(TopicPut("w", 8, 8, PERM_RW))  # update
    assert log.state.topics["w"].read_queues == 8


def test_topic_delete_drops_its_queues() -> None:
    log = Log()
    log.apply(send("gone", 0, b"x"))
    assert log.apply(TopicDelete("gone")).status == "OK"
    assert "gone" not in log.state.topics and log.state.queue_range("gone", 0) == (0, 0)
    assert log.apply(TopicDelete("gone")).status == "TOPIC_NOT_FOUND"


def test_a_retried_send_returns_the_original_result_and_stores_nothing() -> None:
    log = Log()
    first = log.apply(send("t", 1, b"m", keys=("K1",)))
    retry = log.apply(send("t", 2, b"m", b"n", keys=("K1", "K2")))  # retried on another queue
    assert retry.duplicates == (True, False)
    assert (retry.queue_ids[0], retry.queue_offsets[0]) == (first.queue_ids[0], first.queue_offsets[0])
    assert log.state.queue_range("t", 1) == (0, 1) and log.state.queue_range("t", 2) == (0, 1)


def test_the_dedup_ignored_canary_stores_a_retried_send_again() -> None:
    """The seeded bug S21's live run must catch (chaos.live.lost_answers): every replica alike."""
    log = Log(BrokerState(StateConfig(canaries=frozenset({"dedup_ignored"}))))
    log.apply(send("t", 1, b"m", keys=("K1",)))
    assert log.apply(send("t", 1, b"m", keys=("K1",))).duplicates == (False,)
    assert log.state.queue_range("t", 1) == (0, 2)


def test_dedup_forgets_keys_after_its_window() -> None:
    log = Log(BrokerState(StateConfig(dedup_window_ms=1000)))
    log.apply(send("t", 0, b"m", keys=("K",), ts=1000))
    assert log.apply(send("t", 0, b"m", keys=("K",), ts=1500)).duplicates == (True,)
    assert log.apply(send("t", 0, b"m", keys=("K",), ts=5000)).duplicates == (False,)


def test_offset_commits_are_replicated_state() -> None:
    log = Log()
    log.apply(OffsetCommit("g", "t", 0, 42))
    log.apply(OffsetCommit("g", "t", 0, 40))  # a reset may move it back
    assert log.state.offsets[("g", "t", 0)] == 40


def test_a_bad_entry_is_refused_the_same_way_everywhere_without_raising() -> None:
    state = BrokerState()
    assert state.apply(1, 0, b"\xff\x00garbage").status == "BAD_ENTRY"
    assert state.apply(2, 10, b"").status == "NOOP"  # the leader's no-op
    bad_topic = encode(TopicPut("%RETRY%g", 1, 1, PERM_RW))  # reserved, not a system put
    assert state.apply(3, 20, bad_topic).status == "INVALID_TOPIC"  # the wire code
    with pytest.raises(ValueError):
        state.apply(3, 20, bad_topic)  # applying an index twice is a shell bug, not input
    with pytest.raises(BadEntryError):
        decode(encode(send("t", 0, b"x"))[:-3])
    with pytest.raises(BadEntryError):
        BrokerState.restore(b"\x83\x01\x02\x03")


def test_topic_names_follow_rocketmq_rules() -> None:
    assert validate_topic_name("Orders_2-a|b%c") == "Orders_2-a|b%c"
    bad_names: tuple[object, ...] = ("", "with space", "x" * 128, "TBW102", "%DLQ%g", "rmq_sys_x",
                                     "ümlaut", None, 7, b"orders", ["orders"])
    for bad in bad_names:
        with pytest.raises(InvalidTopicError):
            validate_topic_name(bad)
    with pytest.raises(InvalidTopicError, match="a topic name is a string, not bytes"):
        validate_topic_name(b"orders")
    assert validate_topic_name("SCHEDULE_TOPIC_XXXX", allow_system=True)


def runs_entry(parts: list[tuple[str, int, int, int]]) -> SendRunsEntry:
    """A multi-run send: per run (topic, queue, message count, first key number)."""
    return SendRunsEntry(1000, tuple(
        SendRun(t, q, send(t, q, *[b"r%d" % i for i in range(n)],
                           keys=tuple(f"k{k + i}" for i in range(n))).messages, True)
        for t, q, n, k in parts))


ops = st.lists(st.one_of(
    st.builds(lambda t, q, n, k: send(t, q, *[b"b%d" % i for i in range(n)],
                                      keys=tuple(f"k{k + i}" for i in range(n))),
              st.sampled_from(["a", "b"]), st.integers(0, 5), st.integers(1, 3), st.integers(0, 20)),
    st.builds(runs_entry, st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 5),
                                             st.integers(1, 3), st.integers(0, 20)),
                                   min_size=1, max_size=4)),
    st.builds(lambda t, r, w, p: TopicPut(t, r, w, p), st.sampled_from(["a", "b"]),
              st.integers(0, 6), st.integers(0, 6), st.sampled_from([2, 4, 6])),
    st.builds(TopicDelete, st.sampled_from(["a", "b"])),
    st.builds(OffsetCommit, st.just("g"), st.sampled_from(["a", "b"]), st.integers(0, 3),
              st.integers(0, 50)),
), max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops=ops, cut=st.integers(0, 40))
def test_replicas_and_checkpoints_derive_identical_state(ops, cut: int) -> None:
    a, b = Log(), Log()
    results_a = [a.apply(e) for e in ops]
    for e in ops[:cut]:
        b.apply(e)
    # replica b restarts from its checkpoint and applies the rest
    restored = Log(BrokerState.restore(b.state.snapshot()))
    restored.position = b.position
    results_b = [restored.apply(e) for e in ops[cut:]]
    assert restored.state.snapshot() == a.state.snapshot()
    assert results_a[cut:] == results_b


def test_deleting_a_topic_forgets_its_offsets_and_unique_keys() -> None:
    log = Log()
    log.apply(send("t", 0, b"a", keys=("K1",)))
    log.apply(OffsetCommit("g", "t", 0, 1))
    log.apply(TopicDelete("t"))
    assert ("g", "t", 0) not in log.state.offsets
    again = log.apply(send("t", 0, b"a", keys=("K1",)))  # re-created: stored, not a duplicate
    assert again.duplicates == (False,) and again.queue_offsets == (0,)


def test_checkpoints_round_trip_and_a_bad_or_early_one_is_set_aside(tmp_path) -> None:
    from broker.shell.checkpoint import CHECKPOINT_FILE, load_checkpoint, save_checkpoint
    from dledger.raft.types import Entry, EntryKind
    from dledger.storage.commitlog import FileLogStore

    log = Log()
    log.apply(send("t", 0, b"a", b"b"))
    log.apply(OffsetCommit("g", "t", 0, 2))
    store = FileLogStore.open(str(tmp_path / "log"))  # a log that holds those two entries
    store.append([Entry(i, 1, EntryKind.NORMAL, b"x") for i in (1, 2)])
    store.sync()
    store.close()
    save_checkpoint(str(tmp_path), log.state.snapshot())
    assert load_checkpoint(str(tmp_path)).snapshot() == log.state.snapshot()
    log.apply(send("t", 0, b"c"))  # index 3: ahead of what the log holds
    save_checkpoint(str(tmp_path), log.state.snapshot())
    assert load_checkpoint(str(tmp_path)).applied_index == 0  # not trusted: replay the log
    raw = bytearray((tmp_path / CHECKPOINT_FILE).read_bytes())
    raw[-1] ^= 0xFF
    (tmp_path / CHECKPOINT_FILE).write_bytes(bytes(raw))
    assert load_checkpoint(str(tmp_path)).applied_index == 0  # damaged: set aside


fields = st.one_of(st.binary(max_size=3), st.text(max_size=2), st.integers(-2, 2), st.booleans(),
                   st.lists(st.text(max_size=2), max_size=2),
                   st.lists(st.lists(st.text(max_size=2), min_size=1, max_size=3), max_size=2))
valid = st.tuples(st.binary(max_size=3), st.text(max_size=2), st.just([]), st.text(max_size=3),
                  st.just([]), st.integers(0, 9)).map(list)  # the common shape


def _spoil(m: list, k: int, v: object) -> list:
    m = list(m)
    m[k % 6] = v
    return m


shapes = st.one_of(
    valid,
    # one field replaced: wrong types, bad numbers, and unusual but valid keys and properties
    st.builds(_spoil, valid, st.integers(0, 5),
              st.sampled_from([-1, True, None, 1.5, "x", b"x", [], [1], ["k"], [["a"]],
                               [["a", 1]], [["a", "b"]], [["a", "b", "c"]]])),
    st.lists(fields, min_size=5, max_size=7),
    fields)


ODD_VALUES = [-1, True, None, 1.5, 1.0, "x", b"x", [], 2**63, 2**64, 2**63 - 1]
entry_fields = st.lists(st.tuples(st.integers(0, 6), st.sampled_from(ODD_VALUES)), max_size=2)


@settings(max_examples=600, deadline=None)
@given(messages=st.lists(shapes, max_size=3), spoilers=entry_fields)
def test_the_replicas_fast_decode_refuses_exactly_what_decode_refuses(messages, spoilers) -> None:
    import cbor2

    from broker.core.codec import VERSION
    from broker.core.entries import KIND_SEND, StoredSend
    from broker.machine.kinds import decode_for_apply
    entry = [VERSION, KIND_SEND, "t", 0, 1, messages, True, 4]
    for k, v in spoilers:  # the kind or another field of the entry replaced by an odd value
        entry[1 + k] = v
    payload = cbor2.dumps(entry)
    try:
        full = decode(payload)
    except BadEntryError:
        with pytest.raises(BadEntryError):
            decode_for_apply(payload)
        return
    fast = decode_for_apply(payload)
    if not isinstance(full, SendEntry):
        assert fast == full
        return
    assert isinstance(fast, StoredSend)
    assert [(m.body, m.tags, m.unique_key) for m in full.messages] == \
        [(m[0], m[1], m[3]) for m in fast.messages]


@settings(max_examples=600, deadline=None)
@given(messages=st.lists(st.one_of(shapes, st.builds(_spoil, valid, st.integers(0, 5),
                                                     st.sampled_from(ODD_VALUES))), max_size=3))
def test_whatever_the_leader_accepts_every_replica_applies(messages) -> None:
    """A send the leader takes must never become an entry that replicas refuse: with group
    commit, that entry also holds other clients' messages."""
    from broker.core.entries import StoredRuns, StoredSend, encode_runs, encode_send
    from broker.core.sendwire import wire_messages
    from broker.machine.kinds import decode_for_apply
    try:
        wire, _, _ = wire_messages("t", messages, 4 << 20, batch=True)
    except BadEntryError:
        return  # refused on the leader, with a named error
    entry = decode_for_apply(encode_send("t", 0, 1, wire, True, 4))
    assert isinstance(entry, StoredSend) and len(entry.messages) == len(messages)
    runs = decode_for_apply(encode_runs(1, [["t", 0, wire, True, 4], ["u", 1, wire, False, 2]]))
    assert isinstance(runs, StoredRuns) and [len(r.messages) for r in runs.runs] == [len(wire)] * 2


@pytest.mark.parametrize("position, value", [(1, 1.0), (1, True), (2, b"t"), (3, 2**64),
                                             (4, 2**63), (4, -1), (6, 1), (7, 0)])
def test_an_odd_field_is_refused_the_same_way_by_both_decoders_and_never_crashes_apply(
        position: int, value: object) -> None:
    import cbor2

    from broker.core.codec import VERSION
    from broker.core.entries import KIND_SEND
    entry = [VERSION, KIND_SEND, "t", 0, 1, [[b"x", "", [], "K", [], 5]], True, 4]
    entry[position] = value
    decoders_agree(cbor2.dumps(entry))


def decoders_agree(payload: bytes) -> None:
    """Both decoders refuse the payload, or both take it; applying it never raises (every
    replica records the same result) and stores it exactly when they take it."""
    from broker.machine.kinds import decode_for_apply
    try:
        decode(payload)
        accepted = True
    except BadEntryError:
        accepted = False
    if accepted:
        decode_for_apply(payload)
    else:
        with pytest.raises(BadEntryError):
            decode_for_apply(payload)
    result = BrokerState().apply(1, 0, payload)
    assert (result.status == "SEND_OK") == accepted


def test_a_checkpoint_past_the_bound_is_refused_before_any_queue_is_restored() -> None:
    """``BrokerState.restore(..., applied_at_most=...)``: the one decode of a checkpoint reads
    its applied index first; past the bound (the log's end), no queue store is asked anything."""
    from broker.core.consumequeue import MemoryQueues
    from broker.machine.state import CheckpointAheadError

    class Watched(MemoryQueues):
        def __init__(self) -> None:
            super().__init__()
            self.restored: list[int] = []

        def restore(self, no: int, record: Any) -> Any:
            self.restored.append(no)
            return super().restore(no, record)

    log = Log()
    log.apply(send("t", 0, b"a", b"b"))
    blob = log.state.snapshot()
    queues = Watched()
    with pytest.raises(CheckpointAheadError) as err:
        BrokerState.restore(blob, queue_store=queues, applied_at_most=0)
    assert err.value.applied_index == 1 and queues.restored == []
    again = BrokerState.restore(blob, queue_store=queues, applied_at_most=1)
    assert again.snapshot() == blob and queues.restored != []
