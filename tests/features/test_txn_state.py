"""Transactions in the state machine (``broker.features.txn.model``, ``broker.features.txn.apply``):
a half message is in no consumer's queue; COMMIT makes it visible once, ROLLBACK never; a repeated
END answers as the first, the other decision after one is refused; a commit whose consumer offsets
moved rolls back; check-backs count once; the table survives a checkpoint, and older checkpoints
still load."""

from __future__ import annotations

from typing import Any

import cbor2
import pytest

from broker.core.entries import encode_send
from broker.core.state import StateConfig
from broker.features.txn.entries import TxnCheck, TxnEnd
from broker.features.txn.model import (
    CHECK_MAX_TOPIC,
    DECISIONS_KEPT,
    HALF_QUEUE,
    HALF_TOPIC,
    TxnTable,
    committed_message,
    half_message,
    half_of,
)
from broker.machine.kinds import encode
from broker.machine.state import BrokerState


def msg(body: bytes, key: str, props: list[list[str]] | None = None) -> list[Any]:
    return [body, "TagA", ["order-1"], key, props or [], 5]


class Group:
    """A state machine fed entries at increasing indexes and positions."""

    def __init__(self, canaries: frozenset[str] = frozenset()) -> None:
        self.state = BrokerState(StateConfig(canaries=canaries))
        self.index = 0
        self.stored: dict[int, list[Any]] = {}  # half messages by position, as the log has them

    def apply(self, data: bytes) -> Any:
        self.index += 1
        return self.state.apply(self.index, self.index * 1000, data)

    def topic(self, name: str = "orders", queues: int = 2) -> None:
        from broker.core.entries import TopicPut
        assert self.apply(encode(TopicPut(name, queues, queues, 6))).status == "OK"

    def half(self, txn_id: str, key: str, body: bytes = b"b", group: str = "pg",
             topic: str = "orders", qid: int = 1, ts: int = 100) -> Any:
        return self.apply(encode_send(HALF_TOPIC, HALF_QUEUE, ts,
                                      [half_message(msg(body, key), topic, qid, group, txn_id)],
                                      False, 1))

    def end(self, txn_id: str, decision: str, group: str = "pg", ts: int = 200,
            offsets: tuple[tuple[str, str, int, int, int], ...] = (),
            check_max: bool = False) -> Any:
        txn = self.state.txns.open.get(txn_id)
        halves = tuple(txn.halves) if txn else (0,)
        items: tuple[tuple[str, int, list[Any]], ...] = ()
        if txn is not None and (decision == "COMMIT" or check_max):
            items = tuple(self._copy(h, check_max) for h in halves)
        return self.apply(encode(TxnEnd(ts, group, txn_id, decision, halves, items, offsets,
                                        check_max)))

    def _copy(self, offset: int, check_max: bool) -> tuple[str, int, list[Any]]:
        # what the leader reads back from its log: the half message as stored
        unit = self.state.queues[(HALF_TOPIC, HALF_QUEUE)][offset]
        m = self.stored[unit.position]
        topic, qid, _, _ = half_of(m)
        return (CHECK_MAX_TOPIC, 0, m) if check_max else (topic, qid, committed_message(m))


@pytest.fixture
def g() -> Group:
    group = Group()
    group.topic()
    return group


def half_and_keep(g: Group, txn_id: str, key: str, **kw: Any) -> Any:
    result = g.half(txn_id, key, **kw)
    topic, qid = kw.get("topic", "orders"), kw.get("qid", 1)
    g.stored[g.index * 1000] = half_message(msg(kw.get("body", b"b"), key), topic, qid,
                                                kw.get("group", "pg"), txn_id)
    return result


def visible(g: Group, topic: str = "orders", qid: int = 1) -> int:
    return g.state.queue_range(topic, qid)[1]


def test_a_half_message_is_in_no_consumers_queue_until_it_commits(g: Group) -> None:
    r = half_and_keep(g, "T1", "K1")
    assert r.status == "SEND_OK" and r.queue_ids == (1,) and r.queue_offsets == (0,)
    assert visible(g) == 0 and len(g.state.txns) == 1
    assert g.end("T1", "COMMIT").status == "SEND_OK"
    assert visible(g) == 1 and len(g.state.txns) == 0
    unit = g.state.queues[("orders", 1)][0]
    assert (unit.position, unit.slot) == (g.index * 1000, 0)  # the end entry's copy


def test_rollback_never_shows_and_a_repeated_end_answers_as_the_first(g: Group) -> None:
    half_and_keep(g, "T1", "K1")
    assert g.end("T1", "ROLLBACK").status == "OK"
    assert g.end("T1", "ROLLBACK").status == "OK"  # retried across a leader change
    assert g.end("T1", "COMMIT").status == "TXN_ALREADY_DECIDED"
    assert visible(g) == 0
    half_and_keep(g, "T2", "K2")
    assert g.end("T2", "COMMIT").status == "SEND_OK"
    assert g.end("T2", "COMMIT").status == "OK"  # published once
    assert g.end("T2", "ROLLBACK").status == "TXN_ALREADY_DECIDED"
    assert visible(g) == 1


def test_an_end_from_another_producer_group_or_for_nothing_is_refused(g: Group) -> None:
    half_and_keep(g, "T1", "K1")
    assert g.end("T1", "COMMIT", group="other").status == "TXN_NOT_FOUND"
    assert g.end("nope", "COMMIT").status == "TXN_NOT_FOUND"
    assert len(g.state.txns) == 1 and visible(g) == 0


def test_a_half_for_a_decided_transaction_is_refused_and_a_retried_one_stored_once(
        g: Group) -> None:
    half_and_keep(g, "T1", "K1")
    again = half_and_keep(g, "T1", "K1")  # the same unique key: a retry of the same send
    assert again.duplicates == (True,) and g.state.txns.open["T1"].halves == [0]
    half_and_keep(g, "T1", "K2", qid=0)  # a second message of one transaction
    assert g.state.txns.open["T1"].halves == [0, 1]
    assert g.end("T1", "COMMIT").status == "SEND_OK"
    assert (visible(g, qid=0), visible(g, qid=1)) == (1, 1)
    late = g.half("T1", "K3")
    assert late.status == "TXN_ALREADY_DECIDED" and len(g.state.txns) == 0


def test_an_end_that_missed_a_half_is_refused_as_changed(g: Group) -> None:
    half_and_keep(g, "T1", "K1")
    stale = TxnEnd(200, "pg", "T1", "ROLLBACK", (0, 1))
    assert g.apply(encode(stale)).status == "TXN_CHANGED" and len(g.state.txns) == 1


def test_a_commit_whose_offsets_moved_rolls_back(g: Group) -> None:
    from broker.core.entries import OffsetCommit
    g.apply(encode(OffsetCommit("cg", "orders", 0, 5)))
    half_and_keep(g, "T1", "K1")
    conflict = g.end("T1", "COMMIT", offsets=(("cg", "orders", 0, 4, 6),))
    assert conflict.status == "OFFSET_CONFLICT"
    assert visible(g) == 0 and g.state.offsets[("cg", "orders", 0)] == 5
    assert g.state.txns.decided["T1"] == "ROLLBACK"
    half_and_keep(g, "T2", "K2")
    assert g.end("T2", "COMMIT", offsets=(("cg", "orders", 0, 5, 6),
                                          ("cg", "orders", 1, -1, 3))).status == "SEND_OK"
    assert visible(g) == 1 and g.state.offsets[("cg", "orders", 0)] == 6
    assert g.state.offsets[("cg", "orders", 1)] == 3


def test_checks_count_once_however_often_proposed_and_check_max_keeps_a_copy(g: Group) -> None:
    half_and_keep(g, "T1", "K1")
    for _ in range(2):  # a check proposed twice (a deposed leader, a retry)
        g.apply(encode(TxnCheck(300, (("T1", 1),))))
    txn = g.state.txns.open["T1"]
    assert (txn.checks, txn.checked_ms) == (1, 300)
    g.apply(encode(TxnCheck(400, (("T1", 3),))))  # not the next count: ignored
    assert g.state.txns.open["T1"].checks == 1
    assert g.end("T1", "ROLLBACK", check_max=True).status == "OK"
    assert visible(g) == 0 and g.state.queue_range(CHECK_MAX_TOPIC, 0)[1] == 1
    assert CHECK_MAX_TOPIC in g.state.topics


def test_the_canary_makes_a_half_message_visible_before_its_commit() -> None:
    g = Group(frozenset({"txn_half_visible"}))
    g.topic()
    g.half("T1", "K1")
    assert visible(g) == 1  # what the chaos checker must catch


def test_the_transaction_table_survives_a_checkpoint_and_old_ones_load(g: Group) -> None:
    half_and_keep(g, "T1", "K1")
    half_and_keep(g, "T2", "K2")
    g.apply(encode(TxnCheck(300, (("T1", 1),))))
    g.end("T2", "ROLLBACK")
    blob = g.state.snapshot()
    restored = BrokerState.restore(blob)
    assert restored.txns == g.state.txns and restored.snapshot() == blob
    _, applied, core, features = cbor2.loads(blob)
    # a version 3 checkpoint: fields by position, timers and locks only; queues' units within,
    # keys as text (none here)
    fields = [3, applied, core["topics"], [[t, q, units] for t, q, _, units in core["queues"]],
              core["offsets"], [[], [], b""], [features["delay"], features["orderly"]]]
    old = BrokerState.restore(cbor2.dumps(fields))
    assert len(old.txns) == 0 and old.applied_index == g.state.applied_index


def test_decisions_kept_are_bounded() -> None:
    table = TxnTable()
    for k in range(DECISIONS_KEPT + 10):
        table.add_half(f"T{k}", "pg", k, 1)
        table.decide(f"T{k}", "COMMIT")
    assert len(table.decided) == DECISIONS_KEPT and "T0" not in table.decided


def test_a_malformed_half_or_end_is_refused_alike_on_every_replica(g: Group) -> None:
    bad = msg(b"b", "K1", [["REAL_TOPIC", "orders"]])  # no queue, group or transaction id
    r = g.apply(encode_send(HALF_TOPIC, HALF_QUEUE, 1, [bad], False, 1))
    assert r.status == "BAD_ENTRY" and len(g.state.txns) == 0
    forged = cbor2.dumps([1, 9, 1, "pg", "T", "MAYBE", [0], [], [], False, False, False, 4])
    assert g.apply(forged).status == "BAD_ENTRY"


def test_a_commit_of_offsets_alone_is_conditional_too(g: Group) -> None:
    only = TxnEnd(200, "pg", "P:c:1", "COMMIT", (), (), (("cg", "orders", 0, -1, 4),))
    assert g.apply(encode(only)).status == "SEND_OK"
    assert g.state.offsets[("cg", "orders", 0)] == 4 and len(g.state.txns) == 0
    assert g.apply(encode(only)).status == "OK"  # the same END again: answered, nothing moves
    stale = TxnEnd(200, "pg", "P:c:2", "COMMIT", (), (), (("cg", "orders", 0, -1, 9),))
    assert g.apply(encode(stale)).status == "OFFSET_CONFLICT"  # a zombie's: refused
    assert g.state.offsets[("cg", "orders", 0)] == 4
