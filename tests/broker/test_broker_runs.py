"""Multi-run send entries (the leader's group commit over several queues and topics) in the state
machine: offsets dense per queue, each run all or nothing on its own, dedup across runs, the same
on every replica and after a checkpoint; a duplicate's answer names the stored original; the
leader's checks of a send's fields and sizes (named errors, nothing coerced)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import cbor2
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from broker.api.sendpath import SendPath
from broker.config import BrokerConfig
from broker.core.codec import VERSION
from broker.core.entries import (
    KIND_SEND_RUNS,
    Message,
    SendEntry,
    SendRun,
    SendRunsEntry,
    StoredRuns,
    TopicPut,
    encode_runs,
)
from broker.core.sendwire import run_answers, wire_messages
from broker.machine.kinds import decode, decode_for_apply, encode, stored_messages
from broker.machine.state import BrokerState
from dledger.node.runtime import NodeConfig
from protocol.broker_errors import BadEntryError
from protocol.broker_kinds import MessageTooLargeError, message_bytes, offset_msg_id
from protocol.topics import MAX_QUEUES, PERM_READ, TopicConfig
from tests.broker.test_broker_state import Log, decoders_agree


def msgs(*bodies: bytes, keys: tuple[str, ...] = ()) -> tuple[Message, ...]:
    return tuple(Message(b, unique_key=keys[i] if i < len(keys) else "")
                 for i, b in enumerate(bodies))


def runs(*rs: tuple[str, int, tuple[Message, ...]], ts: int = 1000,
         auto: bool = True) -> SendRunsEntry:
    return SendRunsEntry(ts, tuple(SendRun(t, q, m, auto) for t, q, m in rs))


def test_offsets_are_dense_per_queue_across_runs_and_slots_count_over_the_entry() -> None:
    log = Log()
    r = log.apply(runs(("a", 0, msgs(b"a0", b"a1")), ("a", 1, msgs(b"b0")),
                       ("z", 0, msgs(b"z0", b"z1"))))
    assert r.status == "SEND_OK" and [x.status for x in r.runs] == ["SEND_OK"] * 3
    assert [x.queue_offsets for x in r.runs] == [(0, 1), (0,), (0, 1)]
    assert [x.first_slot for x in r.runs] == [0, 2, 3]
    r2 = log.apply(runs(("a", 1, msgs(b"b1")), ("a", 0, msgs(b"a2"))))
    assert [x.queue_offsets for x in r2.runs] == [(1,), (2,)]
    assert [u.slot for u in log.state.units("z", 0, 0, 9)] == [3, 4]
    assert [u.slot for u in log.state.units("a", 0, 0, 9)] == [0, 1, 1]
    assert log.state.topics["z"].write_queues == 4  # auto-created by its run


def test_a_refused_run_stores_nothing_and_leaves_the_other_runs_alone() -> None:
    log = Log()
    log.apply(TopicPut("ro", 4, 4, PERM_READ))
    r = log.apply(SendRunsEntry(1000, (
        SendRun("ok", 0, msgs(b"1"), True),
        SendRun("ro", 0, msgs(b"2"), True),             # read-only
        SendRun("ok", 9, msgs(b"3"), True),             # beyond the topic's 4 queues
        SendRun("missing", 0, msgs(b"4"), False),        # no auto-create for it
        SendRun("%DLQ%g", 0, msgs(b"5"), True),          # a name auto-create must refuse
        SendRun("ok", 1, msgs(b"6"), True, 1))))
    assert [x.status for x in r.runs] == ["SEND_OK", "NO_PERMISSION", "QUEUE_NOT_FOUND",
                                          "TOPIC_NOT_FOUND", "INVALID_TOPIC", "SEND_OK"]
    assert log.state.queue_range("ok", 0) == (0, 1) and log.state.queue_range("ok", 1) == (0, 1)
    assert log.state.queue_range("ro", 0) == (0, 0) and "missing" not in log.state.topics
    assert "%DLQ%g" not in log.state.topics
    assert log.state.units("ok", 1, 0, 1)[0].slot == 5  # refused runs keep their slots
    group = "g"
    answers = run_answers(group, 4096, r)
    assert answers[1][0] == "NO_PERMISSION" and len(answers[1]) == 2
    assert answers[5] == ["SEND_OK", 1, [0], [offset_msg_id(group, 4096, 5)], [False], [1]]


def test_dedup_holds_across_runs_of_one_entry_and_across_entries() -> None:
    log = Log()
    first = log.apply(runs(("t", 0, msgs(b"m", keys=("K1",))),
                           ("t", 2, msgs(b"m", b"n", keys=("K1", "K2"))),  # K1 again: a retry
                           ("u", 0, msgs(b"m", keys=("K1",)))))             # another topic
    _t0, t2, u0 = first.runs
    assert t2.duplicates == (True, False) and t2.queue_ids == (0, 2)
    assert t2.queue_offsets == (0, 0) and u0.duplicates == (False,)
    assert log.state.queue_range("t", 2) == (0, 1)  # only K2 was stored there
    assert t2.originals == ((0, 0, 0),)  # the original is this entry's slot 0
    again = log.apply(SendEntry("t", 3, 2000, msgs(b"n", keys=("K2",)), auto_create=True))
    assert again.duplicates == (True,) and (again.queue_ids, again.queue_offsets) == ((2,), (0,))
    assert again.originals == ((0, 0, 2),)  # entry at position 0, slot 2


def test_a_key_twice_in_one_run_stores_the_first_and_names_it_for_the_second() -> None:
    """A run's units go to its queue at once (``CoreState.store``): a duplicate of a message of
    the same run finds its original stored, and the units after it stay in order."""
    log = Log()
    first = log.apply(runs(("t", 0, msgs(b"a", b"x", b"a", b"b", keys=("K0", "K1", "K0", "K2")))))
    (run,) = first.runs
    assert run.duplicates == (False, False, True, False) and run.queue_offsets == (0, 1, 0, 2)
    assert run.originals == ((2, 0, 0),)  # the third message names slot 0 of this entry
    assert [u.slot for u in log.state.units("t", 0, 0, 9)] == [0, 1, 3]
    replica = Log()  # the same units, the same checksum, however they were appended
    for k, m in enumerate(msgs(b"a", b"x", b"b", keys=("K0", "K1", "K2"))):
        replica.state.queue("t", 0).append(0, (0, 1, 3)[k], len(m.body), 0, 1000)
    assert log.state.queues[("t", 0)].crc == replica.state.queues[("t", 0)].crc


def test_a_duplicate_answer_names_the_stored_original_also_after_an_old_checkpoint() -> None:
    log = Log()
    log.apply(SendEntry("t", 1, 1000, msgs(b"a", b"b", keys=("K0", "K1")), auto_create=True))
    original_position = 0
    restored = Log(BrokerState.restore(log.state.snapshot()))
    restored.position = log.position
    retry = restored.apply(runs(("t", 3, msgs(b"b", b"c", keys=("K1", "K2")))))
    answer = run_answers("g", restored.position, retry)[0]
    assert answer[4] == [True, False]
    assert answer[3][0] == offset_msg_id("g", original_position, 1)  # not the retry's entry
    assert answer[3][1] == offset_msg_id("g", restored.position, 1)
    assert (answer[5][0], answer[2][0]) == (1, 1)


def test_a_multi_run_entry_round_trips_and_both_decoders_agree() -> None:
    entry = runs(("a", 0, msgs(b"x", keys=("K",))), ("b", 3, msgs(b"y", b"z")), ts=77)
    payload = encode(entry)
    assert decode(payload) == entry
    fast = decode_for_apply(payload)
    assert isinstance(fast, StoredRuns) and fast.store_ts_ms == 77
    assert [(r.topic, r.queue_id, r.store_ts_ms, len(r.messages)) for r in fast.runs] == [
        ("a", 0, 77, 1), ("b", 3, 77, 2)]
    assert [m[0] for m in stored_messages(payload)] == [b"x", b"y", b"z"]  # by slot


ODD = [-1, True, None, 1.5, "x", b"x", [], [[]], [["t", 0, [], True, 4]], 2**64]


@settings(max_examples=400, deadline=None)
@given(position=st.integers(0, 7), value=st.sampled_from(ODD), run_count=st.integers(0, 2))
def test_the_fast_decoder_refuses_exactly_what_decode_refuses_for_multi_run_entries(
        position: int, value: object, run_count: int) -> None:
    good_run = ["t", 0, [[b"x", "", [], "K", [], 5]], True, 4]
    entry: list[object] = [VERSION, KIND_SEND_RUNS, 1, [list(good_run) for _ in range(run_count)]]
    if position < 4:
        entry[position] = value
    elif run_count:
        run = entry[3][0]  # type: ignore[index]
        run[position - 4] = value
    decoders_agree(cbor2.dumps(entry))


def test_entries_in_todays_send_format_still_apply_the_same_way() -> None:
    """A send entry exactly as the code before multi-run entries wrote it (bytes fixed here)."""
    old = cbor2.dumps([1, 1, "orders", 2, 1234, [[b"body", "TagA", ["k1"], "U1", [["p", "v"]], 9]],
                       True, 4])
    state = BrokerState()
    r = state.apply(1, 0, old)
    assert (r.status, r.topic, r.queue_id, r.queue_offsets, r.run_results()) == (
        "SEND_OK", "orders", 2, (0,), (r,))
    assert encode(decode(old)) == old
    unit = state.units("orders", 2, 0, 1)[0]
    assert (unit.position, unit.slot, unit.size, unit.store_ts_ms) == (0, 0, 4, 1234)


# -- the leader's checks of a send's messages (broker.core.sendwire) ------------------------------------


@pytest.mark.parametrize("message, field", [
    ([b"x", 5, [], "K", [], 0], "tags"),
    ([b"x", "", [5], "K", [], 0], "key"),
    ([b"x", "", [], "K", [["n", 5]], 0], "property 'n'"),
    ([b"x", "", [], "K", [[5, "v"]], 0], "property name"),
    ([b"x", "", [], "K", ["nv"], 0], "pair"),
    ([b"x", "", [], 5, [], 0], "unique key"),
    ([b"x", "", [], "K", [], 1.5], "born_ts_ms"),
    ([b"x", "", [], "K", [], -1], "born_ts_ms"),
    (["x", "", [], "K", [], 0], "body"),
])
def test_the_leader_refuses_a_non_string_field_by_name_instead_of_coercing_it(
        message: list[object], field: str) -> None:
    with pytest.raises(BadEntryError, match=field):
        wire_messages("t", [[b"fine", "", [], "K0", [], 0], message], 4 << 20, batch=False)


def test_sizes_are_counted_as_rocketmq_counts_them_and_limit_batches_and_messages() -> None:
    m = [b"x" * 100, "TagA", ["k1", "k2"], "U" * 32, [["color", "red"]], 0]
    expected = 5 + 100 + (4 + 4) + (4 + 5) + (8 + 32) + (5 + 3) + 20  # topic "topic"
    assert message_bytes("topic", *m[:5]) == expected
    assert wire_messages("topic", [m, m], 2 * expected, batch=True)[1] == 2 * expected
    plain = [b"y" * 10, "", [], "U" * 32, [], 0]
    assert wire_messages("topic", [plain], 1 << 20, batch=True)[1] == message_bytes(
        "topic", b"y" * 10, "", [], "U" * 32, [])
    assert message_bytes("t", b"", "é", [], "", []) == 1 + 8 + 20 + 4 + 2  # UTF-8 bytes
    with pytest.raises(MessageTooLargeError, match="batch"):
        wire_messages("topic", [m, m], 2 * expected - 1, batch=True)
    assert wire_messages("topic", [m, m], expected, batch=False)[1] == 2 * expected
    with pytest.raises(MessageTooLargeError, match="message"):
        wire_messages("topic", [m, m], expected - 1, batch=False)


def test_the_broker_options_refuse_values_no_broker_can_honour(tmp_path) -> None:
    from click.testing import CliRunner

    from broker.cli import main
    from broker.config import BrokerConfig
    from dledger.node.runtime import NodeConfig
    from protocol.broker_kinds import MAX_MESSAGE_BYTES_CEILING

    node = NodeConfig(group="g", node_id="n0", peers={"n0": ("127.0.0.1", 1)},
                      data_dir=str(tmp_path))
    for bad in ({"default_queues": 0}, {"max_message_bytes": MAX_MESSAGE_BYTES_CEILING + 1}):
        with pytest.raises(ValueError):
            BrokerConfig(node, **bad)  # type: ignore[arg-type]
    base = ["start", "--group", "g", "--id", "n0", "--peers", "n0=127.0.0.1:1",
            "--data-dir", str(tmp_path)]
    for option, value in (("--max-message-bytes", MAX_MESSAGE_BYTES_CEILING + 1),
                          ("--default-queues", 0)):
        result = CliRunner().invoke(main, [*base, option, str(value)])
        assert result.exit_code == 2 and option in result.output


def test_the_status_names_offset_groups_within_a_byte_budget() -> None:
    import json

    from broker.server import OFFSET_GROUPS_SHOWN_BYTES, _shown

    names = sorted(f"{'é' * 250}{k:05d}" for k in range(2000))  # escaped: ~1.5 KB each as JSON
    shown = _shown(names)
    assert shown == names[:len(shown)] and 0 < len(shown) < len(names)
    assert len(json.dumps(shown)) <= OFFSET_GROUPS_SHOWN_BYTES
    assert _shown(["a", "b"]) == ["a", "b"]


# -- what the leader admits, every replica decodes (broker.api.sendpath) -------------------------

_QUEUE_IDS = st.one_of(st.integers(0, 3), st.integers(0, 3), st.integers(-2, 2 * MAX_QUEUES),
                       st.integers(-(2**80), 2**80),
                       st.sampled_from([2**63 - 1, 2**63, 2**64, 10**30]))
_TEXT = st.text(max_size=8)
# values a property the broker reads as a number may be given: digits to isdigit() that int()
# refuses ("²", "①") or reads ("٣"), signs, spaces, long ones
_NUMBERISH = st.one_of(st.sampled_from(["0", "1", "3", "18", "99", "²", "1²", "①", "٣", "-1",
                                        " 5", "", "9" * 19, "1e3"]), _TEXT)
_NUMERIC_NAMES = st.sampled_from(["DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_MS",
                                  "TIMER_DELAY_SEC", "TTL_MS", "PRIORITY", "REAL_QID", "UNIQ_KEY"])
_PROPERTY = st.one_of(st.tuples(_NUMERIC_NAMES, _NUMBERISH), st.tuples(_NUMERIC_NAMES, _NUMBERISH),
                      st.tuples(_TEXT, _TEXT)).map(list)
_MESSAGE = st.tuples(st.binary(max_size=8), _TEXT, st.lists(_TEXT, max_size=2), _TEXT,
                     st.lists(_PROPERTY, max_size=2),
                     st.one_of(st.integers(0, 2**40), st.integers(0, 2**40),
                               st.integers(-2, 2**65))).map(list)
_GOOD = ["good", 0, [[b"ok", "", [], "K-good", [], 1]]]


@settings(max_examples=400, deadline=None)
@example(runs=[("t", 0, [[b"x", "", [], "K1", [["DELAY", "\u00b2"]], 1]], [])])  # int() refuses
@example(runs=[("t", 2**63, [[b"x", "", [], "K2", [], 1]], [])])  # past an entry's integers
@given(runs=st.lists(st.tuples(st.sampled_from(["t", "t2", "created", "TBW102", "%RETRY%g"]),
                               _QUEUE_IDS,
                               st.lists(_MESSAGE, min_size=1, max_size=2),
                               st.lists(st.integers(-1, 2 * MAX_QUEUES), max_size=1)),
                     min_size=1, max_size=4))
def test_no_run_the_leader_admits_fails_the_runs_it_travels_with(
        runs: list[tuple[str, int, list[list[Any]], list[int]]]) -> None:
    """Whatever a client puts in a run, the leader's send path (``SendPath._runs``, SEND_RUNS:
    the front ends gather many clients' sends in one) refuses that run alone or admits it, and
    an entry of the admitted runs decodes and applies on every replica with a good run beside
    them stored: a field no replica decodes, or a check that raised unnamed, would have failed
    the other runs, other clients' sends, with it."""
    node = NodeConfig(group="a", node_id="n0", peers={"n0": ("127.0.0.1", 1)},
                      data_dir="/nonexistent")
    host = SimpleNamespace(config=BrokerConfig(node),
                           state=SimpleNamespace(topics={"created": TopicConfig("created", 4, 4)}))
    path = SendPath(host)  # type: ignore[arg-type]
    admitted, answers, created = path._runs([[list(_GOOD), *[[t, q, raw, *asked]
                                                               for t, q, raw, asked in runs]]])
    assert answers[0] is None and len(answers) == len(runs) + 1
    entry = encode_runs(1, [[t, q, msgs, True, created.get(t, 4)] for t, q, msgs, _ in admitted])
    stored = decode_for_apply(entry)  # (raises on an entry the replicas would refuse)
    assert len(stored.runs) == len(admitted)
    result = BrokerState().apply(1, 0, entry)
    assert result.status == "SEND_OK", result
    assert result.run_results()[0].status == "SEND_OK"  # the good run, whatever rode with it
