"""The retry and dead-letter checker (``chaos.live.checkers.retry``) on hand-made histories: a clean
one with redeliveries passes; a count that goes back, a message retried once too often, a wrong
or doubled or missing dead letter, a lost message are each named."""

from __future__ import annotations

from chaos.live.checkers.retry import (
    ALWAYS,
    DeadLetter,
    RetryDelivery,
    RetrySent,
    check_retries,
    fails,
)

MAX = 3
RETRY_Q = "%RETRY%g/g/0"


def history(msg_id: str, plan: int, counts: list[int] | None = None,
            origin: str = "a") -> list[RetryDelivery]:
    """The deliveries of one message: copy k (carrying ``counts[k]``) fails as the plan says."""
    n = (MAX + 1 if plan == ALWAYS else plan + 1) if counts is None else len(counts)
    counts = list(range(n)) if counts is None else counts
    out = []
    for k, times in enumerate(counts):
        copy = f"{origin}/g/0@{k}" if k == 0 else f"{RETRY_Q}@{msg_id}-{k}"
        out.append(RetryDelivery(msg_id, copy, times, not fails(k, plan), float(len(out))))
    return out


def clean() -> tuple[dict[str, RetrySent], list[RetryDelivery], list[DeadLetter]]:
    sent = {f"m{p}": RetrySent(f"m{p}", p, f"off-m{p}") for p in (0, 1, 2)}
    sent["mx"] = RetrySent("mx", ALWAYS, "off-mx")
    deliveries = [d for s in sent.values() for d in history(s.msg_id, s.plan)]
    return sent, deliveries, [DeadLetter("mx", 0, MAX, "off-mx")]


def kinds(problems: list[str]) -> list[str]:
    return sorted(p.split(":")[0] for p in problems)


def test_the_listener_rule_fails_copies_below_the_plan() -> None:
    assert [fails(k, 2) for k in range(4)] == [True, True, False, False]
    assert all(fails(k, ALWAYS) for k in range(10)) and not fails(0, 0)


def test_a_clean_history_passes_and_redeliveries_of_one_copy_are_allowed() -> None:
    sent, deliveries, dead = clean()
    assert check_retries(sent, deliveries, dead, MAX) == []
    again = [RetryDelivery(d.msg_id, d.copy, d.reconsume_times, d.ok, d.t + 0.5)
             for d in deliveries]  # every copy delivered twice (a failover, a hand-over)
    assert check_retries(sent, deliveries + again, dead, MAX) == []
    # a message whose send's outcome is unknown is judged by its copies only
    assert check_retries({}, history("u", 1), [], MAX) == []


def test_a_count_that_goes_back_is_named() -> None:
    sent, deliveries, dead = clean()
    lost_count = history("m2", 2, counts=[0, 1, 1, 2])  # a new leader restarted the count
    deliveries = [d for d in deliveries if d.msg_id != "m2"] + lost_count
    assert kinds(check_retries(sent, deliveries, dead, MAX)) == ["attempts", "count"]


def test_a_message_dead_lettered_after_the_wrong_number_of_copies_is_named() -> None:
    sent, deliveries, dead = clean()
    longer = history("mx", ALWAYS, counts=[0, 1, 2, 3, 1, 2, 3])
    deliveries = [d for d in deliveries if d.msg_id != "mx"] + longer
    problems = check_retries(sent, deliveries, dead, MAX)
    assert kinds(problems) == ["attempts", "count"]
    assert "7 failed copies, not 4" in next(p for p in problems if p.startswith("attempts"))


def test_wrong_doubled_missing_and_stray_dead_letters_are_named() -> None:
    sent, deliveries, _ = clean()
    wrong = [DeadLetter("mx", 0, MAX - 1, "off-other")]
    assert kinds(check_retries(sent, deliveries, wrong, MAX)) == ["dead letter", "dead letter"]
    twice = [DeadLetter("mx", 0, MAX, "off-mx"), DeadLetter("mx", 1, MAX, "off-mx")]
    assert kinds(check_retries(sent, deliveries, twice, MAX)) == ["dead letter"]
    assert kinds(check_retries(sent, deliveries, [], MAX)) == ["lost"]
    stray = [DeadLetter("mx", 0, MAX, "off-mx"), DeadLetter("m1", 1, MAX, "off-m1"),
             DeadLetter("zz", 2, MAX, "")]
    assert kinds(check_retries(sent, deliveries, stray, MAX)) == ["dead letter", "dead letter"]


def test_a_message_never_consumed_or_consumed_after_too_many_copies_is_named() -> None:
    sent, deliveries, dead = clean()
    unfinished = [d for d in deliveries if not (d.msg_id == "m2" and d.ok)]
    assert kinds(check_retries(sent, unfinished, dead, MAX)) == ["lost"]
    extra = [*deliveries, RetryDelivery("m0", f"{RETRY_Q}@m0-1", 1, True, 99.0)]
    assert kinds(check_retries(sent, extra, dead, MAX)) == ["attempts"]
