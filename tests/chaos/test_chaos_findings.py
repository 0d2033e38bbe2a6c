"""What the live chaos checkers report: losses split per producer and per replica, divergences,
duplicates, order findings, bounded examples; informational findings never fail a run."""

from __future__ import annotations

from typing import Any

from chaos.live.checkers import safety as checker
from tests.chaos.checker_runs import (
    LAT,
    T0,
    Run,
    acked_value_stored_twice,
    clean,
    failed_send_read,
    fired,
    later_send_of_another_producer_gets_a_smaller_offset,
    lost_with_dumps,
    one_replica_shorter,
    phantom_value,
    producer_reordered_with_equal_timestamps,
    stale_poll_at_an_acked_offset,
)


def test_lost_reports_the_value_and_lost_on_replica_every_node() -> None:
    result = lost_with_dumps().check()
    assert result.lost.count == 1 and result.lost.examples[0]["value"] == "p1-4"
    assert result.lost.examples[0]["offset"] == 4 and result.lost.examples[0]["queue"] == 0
    assert {n: f.count for n, f in result.lost_on_replica.items()} == {"n1": 1, "n2": 1, "n3": 1}
    assert result.lost_on_replica_max == 1


def test_lost_is_split_per_producer_into_prefix_middle_postfix() -> None:
    r = Run()
    for keep in (False, True, False, True, False):
        r.send("p0", 0, store=keep)
    r.send("p1", 1, store=False)  # nothing of p1 survives: all prefix
    obs = checker.observe(r.history, {}, {0: list(enumerate(r.queues[0]))})
    found = checker.check_lost(obs)
    assert found.count == 4
    assert found.detail["per_producer"] == {"p0": {"prefix": 1, "middle": 1, "postfix": 1},
                                            "p1": {"prefix": 1, "middle": 0, "postfix": 0}}


def test_allow_loss_reports_loss_without_failing() -> None:
    result = lost_with_dumps().check(allow_loss=True)
    assert result.verdict == "PASS"
    assert result.to_dict()["lost"] == 1 and result.to_dict()["lost_on_replica_max"] == 1


def test_lost_on_replica_names_the_node_missing_the_value() -> None:
    r = clean().finish()
    del r.replicas["n2"][1][-1]
    found = checker.check_lost_on_replica(checker.observe(r.history, r.replicas, r.drain))
    assert {n: f.count for n, f in found.items()} == {"n1": 0, "n2": 1, "n3": 0}
    assert found["n2"].examples[0]["value"] == "p0-4"


def test_replica_identity_reports_lengths_and_value_divergences() -> None:
    r = one_replica_shorter()
    found = r.check().replica_divergence
    assert found.count == 1
    assert found.examples[0] == {"kind": "length", "queue": 1,
                                 "ends": {"leader_drain": 4, "n1": 4, "n2": 4, "n3": 3}}
    r = clean().finish()
    r.replicas["n3"][0][1] = (1, "p1-1")  # n3 holds another value at q0 offset 1
    found = checker.check_replica_identity(checker.observe(r.history, r.replicas, r.drain))
    assert found.count == 1 and found.examples[0]["kind"] == "value"
    assert found.examples[0]["values"] == {"leader_drain": "p1-0", "n1": "p1-0", "n2": "p1-0", "n3": "p1-1"}


def test_the_drain_must_equal_the_replicas() -> None:
    r = clean().finish()
    r.drain[1].append((3, "p0-3"))
    assert r.check().replica_divergence.examples[0]["ends"]["leader_drain"] == 4


def test_inconsistent_offsets_lists_both_values_and_their_sources() -> None:
    found = stale_poll_at_an_acked_offset().check().inconsistent_offsets
    assert found.count == 1
    item = found.examples[0]
    assert (item["queue"], item["offset"]) == (0, 1)
    assert set(item["values"]) == {"p1-0", "p1-4"} and item["values"]["p1-4"] == ["poll c0"]
    assert "ack p1" in item["values"]["p1-0"]


def test_duplicates_of_an_info_send_are_retry_duplicates_and_do_not_fail() -> None:
    r = clean().finish()
    r.everywhere(1, "p0-3")  # the info send, stored twice (a client-library retry)
    r.everywhere(1, "p0-3")
    result = r.check()
    assert result.verdict == "PASS"
    assert result.duplicates.count == 0 and result.retry_duplicates.count == 1
    assert result.retry_duplicates.examples[0] == {"value": "p0-3", "positions": [(1, 3), (1, 4)],
                                                   "outcome": "info"}
    assert result.recovered.examples == ["p0-3"]


def test_a_protocol_duplicate_reports_positions_and_outcome() -> None:
    found = acked_value_stored_twice().check().duplicates
    assert found.examples == [{"value": "p0-0", "positions": [(0, 0), (0, 4)], "outcome": "ok"}]


def test_an_ack_disagreeing_with_the_reads_is_a_duplicate() -> None:
    r = clean().finish()
    for ev in r.history:
        if ev["f"] == "send" and ev["type"] == "ok" and ev["value"] == "p0-4":
            ev["offset"] = 7  # acked at 7, stored at 2
    assert fired(r.check()) == {"duplicates_protocol"}


def test_recovered_counts_info_sends_that_took_effect_without_failing() -> None:
    r = clean()
    r.send("p1", 1, "info", store=True)
    result = r.finish().check()
    assert result.verdict == "PASS" and result.recovered.examples == ["p1-4"]
    assert result.to_dict()["recovered"] == 1


def test_unexpected_and_failed_but_read_name_the_values() -> None:
    assert phantom_value().check().unexpected.examples == ["p9-0"]
    assert failed_send_read().check().failed_but_read.examples == ["p1-2"]


def test_order_findings_name_both_sends() -> None:
    fifo = producer_reordered_with_equal_timestamps().check().producer_fifo
    assert fifo.examples == [{"proc": "p0", "queue": 0, "earlier": ["p0-5", 5], "later": ["p0-6", 4]}]
    rt = later_send_of_another_producer_gets_a_smaller_offset().check().realtime_order
    assert rt.count == 1
    assert rt.examples[0]["value"] == "p1-4" and rt.examples[0]["acked_before"][:2] == ["p0-5", 5]


def test_realtime_order_ignores_concurrent_sends() -> None:
    r = clean()
    end, t = len(r.queues[0]), r.t
    a = r.send("p0", 0, store=False, offset=end + 1, at=t)
    b = r.send("p1", 0, store=False, offset=end, at=t + LAT / 2)  # overlaps a: any order is fine
    r.queues[0] += [b, a]
    assert r.finish().check().verdict == "PASS"


def test_consumer_order_reports_skips_backward_polls_and_gaps_inside_a_poll() -> None:
    def poll(start: int, offsets: list[int], session: int = 0) -> dict[str, Any]:
        return {"proc": "c0", "type": "ok", "f": "poll", "queue": 0, "from": start, "session": session,
                "values": [[o, f"p0-{o}"] for o in offsets], "t": T0}

    def kinds(polls: list[dict[str, Any]]) -> list[str]:
        found = checker.check_consumer_order(checker.observe(polls, {}, {}))
        return [item["kind"] for item in found.examples]

    assert kinds([poll(0, [0, 1]), poll(2, [2]), poll(3, []), poll(3, [3])]) == []
    assert kinds([poll(0, [0, 1]), poll(3, [3])]) == ["poll-skip"]
    assert kinds([poll(0, [0, 1]), poll(1, [1])]) == ["nonmonotonic-poll"]
    assert kinds([poll(0, [0, 2])]) == ["poll-skip"]
    assert kinds([poll(0, [0, 1, 1])]) == ["nonmonotonic-poll"]
    assert kinds([poll(0, [0, 1]), poll(0, [0], session=1)]) == []  # a re-seek starts a new session
    failed = {"proc": "c0", "type": "fail", "f": "poll", "queue": 0, "from": 2, "session": 0, "t": T0}
    assert kinds([poll(0, [0, 1]), failed, poll(2, [2])]) == []


def test_at_most_ten_examples_but_the_full_count() -> None:
    r = Run()
    for _ in range(15):
        r.send("p0", 0, store=False)
    found = checker.check_lost(checker.observe(r.history, {}, {}))
    assert found.count == 15 and len(found.examples) == checker.MAX_EXAMPLES


def test_a_value_a_resending_client_stored_under_two_ids_is_a_retry_duplicate() -> None:
    """The C++ client sends an unanswered message again under a new id (two messages to the
    broker): a retry duplicate for its procs when the leader's copies have ids of their own,
    and a protocol duplicate when one id is stored twice, an id is unknown, or another proc's."""
    def run(proc: str) -> tuple[Run, list[tuple[int, int]]]:
        r = clean()
        value = r.send(proc, 0)  # acknowledged, then stored again by the client's retry
        r.finish()
        r.everywhere(0, value)
        spots = [(0, o) for o, v in r.drain[0] if v == value]
        assert len(spots) == 2
        return r, spots

    r, spots = run("r0")
    result = r.check(message_ids={spots[0]: "A1", spots[1]: "A2"}, resending=frozenset({"r0"}))
    assert result.verdict == "PASS" and result.duplicates.count == 0
    assert result.retry_duplicates.examples[0]["message_ids"] == ["A1", "A2"]
    for ids, resending in (({spots[0]: "A1", spots[1]: "A1"}, {"r0"}),  # one id stored twice
                           ({spots[0]: "A1"}, {"r0"}),  # a copy the leader does not hold
                           ({spots[0]: "A1", spots[1]: "A2"}, set())):  # a proc that never resends
        result = r.check(message_ids=ids, resending=frozenset(resending))
        assert result.verdict == "FAIL" and result.duplicates.count == 1, (ids, resending)
    r.replicas["n1"][0].append((len(r.drain[0]), "r0-0"))  # a copy where the leader holds
    r.drain[0].append((len(r.drain[0]), "p1-9"))  # another message (under an id of its own)
    ids = {spots[0]: "A1", spots[1]: "A2", (0, len(r.drain[0]) - 1): "A3"}
    assert r.check(message_ids=ids, resending=frozenset({"r0"})).duplicates.count == 1
    r, spots = run("p0")
    result = r.check(message_ids={spots[0]: "A1", spots[1]: "A2"}, resending=frozenset({"r0"}))
    assert result.duplicates.count == 1
