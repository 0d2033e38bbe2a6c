"""The transactional-message checker (``chaos.live.checkers.txn``) on hand-made histories: a clean
one with redeliveries and a producer killed mid-transaction passes; a rolled-back message
consumed, a half message consumed before its commit, a commit stored twice, under another
transaction id or lost, a message a group never got, a stray one and open transactions are each
named. Also the producers' plan rule (``chaos.live.features.txn_producer.check_answer``) and their records
surviving a torn line."""

from __future__ import annotations

import json
from pathlib import Path

from chaos.live.checkers.txn import (
    PLANS,
    Resolution,
    TxnDelivery,
    TxnEvent,
    TxnStored,
    check_transactions,
    redeliveries,
)
from chaos.live.features.txn_producer import Recorder, body, check_answer, load, parse
from client.producer.transaction import TransactionState

GROUPS = ("ga", "gb")
DONE = Resolution(0, 3.0, 17.0)


def life(send_id: str, plan: str, t: float, by: str = "execute") -> list[TxnEvent]:
    """One send's records: invoked at t, half at t + 0.1, decided (as planned) at t + 1."""
    out = [TxnEvent("invoke", send_id, t, plan=plan, producer="p"),
           TxnEvent("half", send_id, t + 0.1, txn_id=f"x{send_id}")]
    final = "ROLLBACK" if plan in ("rollback", "unknown-rollback") else "COMMIT"
    out.append(TxnEvent("decide", send_id, t + 1, state=final, by=by, producer="p"))
    if by == "execute":
        out.append(TxnEvent("end", send_id, t + 1.1, state=final))
    return out


def clean() -> tuple[list[TxnEvent], list[TxnDelivery], list[TxnStored]]:
    events: list[TxnEvent] = []
    stored: list[TxnStored] = []
    deliveries: list[TxnDelivery] = []
    for k, plan in enumerate(PLANS):
        sid = f"p-{k}"
        events += life(sid, plan, 10.0 * k, "execute" if plan in ("commit", "rollback")
                       else "check")
        if plan in ("commit", "raise-commit", "unknown-commit"):
            stored.append(TxnStored(sid, f"0@{k}", f"x{sid}"))
            deliveries += [TxnDelivery(g, sid, f"0@{k}", 10.0 * k + 1.5) for g in GROUPS]
    return events, deliveries, stored


def kinds(problems: list[str]) -> list[str]:
    return sorted(p.split(":")[0] for p in problems)


def test_a_clean_history_with_redeliveries_and_a_killed_producer_passes() -> None:
    events, deliveries, stored = clean()
    assert check_transactions(events, deliveries, stored, GROUPS, DONE) == []
    again = [TxnDelivery(d.group, d.send_id, d.copy, d.t + 5) for d in deliveries]
    assert check_transactions(events, deliveries + again, stored, GROUPS, DONE) == []
    assert redeliveries(deliveries + again) == {"ga": 3, "gb": 3}
    # a producer killed after its half message: another one's check-back commits it
    killed = [TxnEvent("invoke", "k-0", 1.0, plan="commit", producer="tp1"),
              TxnEvent("half", "k-0", 1.1, txn_id="xk"),
              TxnEvent("decide", "k-0", 4.0, state="COMMIT", by="check", producer="ta")]
    late = [TxnDelivery(g, "k-0", "1@0", 4.2) for g in GROUPS]
    assert check_transactions(events + killed, deliveries + late,
                              [*stored, TxnStored("k-0", "1@0", "xk")], GROUPS, DONE) == []
    # a send whose half was never acknowledged may be in the topic or not: both pass
    unsure = [TxnEvent("invoke", "u-0", 1.0, plan="commit", producer="ta"),
              TxnEvent("fail", "u-0", 4.0, state="TimeoutError")]
    assert check_transactions(events + unsure, deliveries, stored, GROUPS, DONE) == []


def test_a_rolled_back_message_stored_or_consumed_is_named() -> None:
    events, deliveries, stored = clean()
    shown = [TxnStored("p-1", "1@7", "xp-1")]  # plan rollback
    consumed = [TxnDelivery("ga", "p-3", "1@8", 40.5)]  # plan unknown-rollback
    problems = check_transactions(events, deliveries + consumed, stored + shown, GROUPS, DONE)
    assert kinds(problems) == ["rolled back", "rolled back"]
    assert "consumed by ga" in next(p for p in problems if "p-3" in p)


def test_a_half_message_consumed_before_its_commit_is_named() -> None:
    events, deliveries, stored = clean()
    early = [TxnDelivery("gb", "p-4", "0@4", 40.5)]  # unknown-commit decided at 41
    problems = check_transactions(events, deliveries + early, stored, GROUPS, DONE)
    assert kinds(problems) == ["early"]
    assert "500 ms before its COMMIT" in problems[0]
    undecided = [e for e in events if not (e.send_id == "p-0" and e.kind == "decide")]
    problems = check_transactions(undecided, deliveries, stored, GROUPS, DONE)
    assert kinds(problems) == ["early"]  # one line for the send, naming both deliveries
    assert "no COMMIT was decided (2 early deliveries)" in problems[0]


def test_a_commit_stored_twice_under_another_id_or_lost_is_named() -> None:
    events, deliveries, stored = clean()
    twice = [*stored, TxnStored("p-2", "1@9", "xp-2")]
    more = [TxnDelivery(g, "p-2", "1@9", 30.0 + 2) for g in GROUPS]
    assert kinds(check_transactions(events, deliveries + more, twice, GROUPS, DONE)) == ["twice"]
    renamed = [TxnStored(s.send_id, s.copy, "other" if s.send_id == "p-0" else s.txn_id)
               for s in stored]
    assert kinds(check_transactions(events, deliveries, renamed, GROUPS, DONE)) == ["id"]
    lost = [s for s in stored if s.send_id != "p-4"]
    gone = [d for d in deliveries if d.send_id != "p-4"]
    problems = check_transactions(events, gone, lost, GROUPS, DONE)
    assert kinds(problems) == ["lost"] and "unknown-commit" in problems[0]


def test_a_message_a_group_never_got_and_strays_are_named() -> None:
    events, deliveries, stored = clean()
    missed = [d for d in deliveries if not (d.send_id == "p-0" and d.group == "gb")]
    problems = check_transactions(events, missed, stored, GROUPS, DONE)
    assert kinds(problems) == ["unconsumed"] and "gb" in problems[0]
    stray = [TxnStored("zz-1", "1@3", "")]
    assert kinds(check_transactions(events, deliveries, stored + stray, GROUPS, DONE)) == \
        ["unexpected"]
    wrong_copy = [TxnDelivery("ga", "p-0", "1@5", 3.0)]
    assert kinds(check_transactions(events, deliveries + wrong_copy, stored, GROUPS, DONE)) == \
        ["unexpected"]


def test_open_or_late_transactions_are_unresolved() -> None:
    events, deliveries, stored = clean()
    for r in (Resolution(3, None, 17.0), Resolution(-1, None, 17.0), Resolution(0, 18.5, 17.0)):
        assert kinds(check_transactions(events, deliveries, stored, GROUPS, r)) == ["unresolved"]


def test_the_plan_is_the_local_database() -> None:
    assert parse(body("tp3-7", "unknown-commit", 5000)) == ("tp3-7", "unknown-commit", 5000)
    c, r, u = TransactionState.COMMIT, TransactionState.ROLLBACK, TransactionState.UNKNOWN
    assert [check_answer(p, 5000, 4000) for p in PLANS] == [c, r, c, r, u]
    assert check_answer("unknown-commit", 5000, 5000) is c


def test_a_producer_processs_records_survive_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "txn-tp1.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        rec = Recorder(f)
        rec.add("invoke", "tp1-0", plan="commit", producer="tp1")
        rec.add("half", "tp1-0", txn_id="x")
        f.write(json.dumps({"kind": "decide", "send_id": "tp1-0"})[:20])  # killed mid-line
    got = load(str(path))
    assert [e.kind for e in got] == ["invoke", "half"] and got == rec.events
    assert load(str(tmp_path / "missing.jsonl")) == []
