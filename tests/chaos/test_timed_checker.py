"""The recall and TTL checkers (``chaos.live.checkers.timed``) on made-up histories: what each
must find (a recalled message delivered, an unrecalled one lost, one received before it was due,
one received after its TTL passed, a kept one lost) and what it must not claim (a refused or
unanswered recall, a short-TTL message never received, a receive that began before the expiry
even if it returned after)."""

from __future__ import annotations

from chaos.live.checkers.timed import CLOCK_SLACK_MS, Seen, check_recall, check_ttl

DUE = 10_000


def got(mid: str, began_ms: float, ended_ms: float | None = None, store_ms: int | None = None,
        ttl_ms: int | None = None, due_ms: int | None = None) -> Seen:
    return Seen(mid, began_ms, began_ms + 5 if ended_ms is None else ended_ms, store_ms, ttl_ms,
                due_ms)


def test_a_clean_recall_history_passes() -> None:
    due = {"kept": DUE, "recalled": DUE, "refused": DUE, "unknown": DUE}
    recalls = {"recalled": "ok", "refused": "refused", "unknown": "unknown"}
    v = check_recall(due, recalls, [got("kept", DUE, DUE + 20), got("refused", DUE, DUE + 5)])
    assert v.ok, v.lines()
    assert (v.delayed, v.recalled, v.received) == (4, 1, 2)


def test_a_recalled_message_received_is_delivered() -> None:
    v = check_recall({"r": DUE}, {"r": "ok"}, [got("r", DUE, DUE + 3), got("r", DUE + 9000)])
    assert not v.ok and len(v.delivered) == 1  # named once, however often it came
    assert v.lines()[0].startswith("recall: delivered: r received")


def test_an_unrecalled_delayed_message_never_received_is_lost() -> None:
    v = check_recall({"a": DUE, "b": DUE}, {}, [got("a", DUE, DUE + 5)])
    assert v.lost == ["b"]
    assert v.lines() == ["recall: lost: acknowledged delayed send b (no recall tried) never "
                         "received"]


def test_a_refused_or_unanswered_recall_excuses_an_absent_message() -> None:
    v = check_recall({"a": DUE, "b": DUE}, {"a": "refused", "b": "unknown"}, [])
    assert v.ok, v.lines()


def test_a_receive_that_returned_before_the_due_time_is_early() -> None:
    v = check_recall({"a": DUE}, {}, [got("a", DUE - 900, DUE - 800)])
    assert len(v.early) == 1 and "800 ms before its due time" in v.early[0]
    # one that returned at the due time is not (handed out no later than that)
    assert check_recall({"a": DUE}, {}, [got("a", DUE - 900, DUE - CLOCK_SLACK_MS)]).ok


def test_the_delivered_due_time_judges_a_message_whose_send_was_not_acknowledged() -> None:
    v = check_recall({}, {}, [got("x", DUE - 900, DUE - 800, due_ms=DUE)])
    assert len(v.early) == 1 and v.received == 0


def test_a_clean_ttl_history_passes() -> None:
    # a short TTL received in time; a kept one received late; a short one never received
    seen = [got("s1", 1_900, 2_500, store_ms=1_000, ttl_ms=1_000),
            got("k1", 60_000, store_ms=1_000, ttl_ms=600_000)]
    v = check_ttl({"k1"}, seen)
    assert v.ok, v.lines()
    assert (v.received, v.kept) == (2, 1)


def test_a_message_received_after_its_ttl_passed_is_expired() -> None:
    seen = [got("s1", 2_300, store_ms=1_000, ttl_ms=1_000)]
    v = check_ttl(set(), seen)
    assert len(v.expired) == 1 and "began 300 ms after it expired" in v.expired[0]
    assert v.lines()[0].startswith("ttl: expired: s1")


def test_a_receive_that_began_within_the_ttl_is_not_expired() -> None:
    # began at the edge (the broker decided at or after that): not proof of a late hand-out
    assert check_ttl(set(), [got("s1", 2_000 + CLOCK_SLACK_MS, 9_000, 1_000, 1_000)]).ok
    # no store time or TTL given: nothing to judge it by
    assert check_ttl(set(), [got("s1", 90_000, store_ms=None, ttl_ms=1_000)]).ok


def test_a_kept_message_never_received_is_lost() -> None:
    v = check_ttl({"k1", "k2"}, [got("k1", 5_000, store_ms=1_000, ttl_ms=600_000)])
    assert v.lost == ["k2"]
    assert v.lines() == ["ttl: lost: acknowledged send k2 (its TTL not passed) never received"]
