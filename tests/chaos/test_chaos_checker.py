"""The live chaos checkers (chaos/live/checkers/safety.py, availability.py) on small synthetic
runs: a clean run passes every check, and for each check one seeded anomaly makes exactly that
check fire (the checkers can fail)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from chaos.live.checkers import safety as checker
from tests.chaos.checker_runs import (
    Run,
    acked_value_stored_twice,
    clean,
    consumer_skips_ahead,
    failed_send_read,
    fired,
    later_send_of_another_producer_gets_a_smaller_offset,
    lost_with_dumps,
    lost_with_no_replica_dumps,
    missing_from_every_replica_but_polled,
    one_replica_shorter,
    phantom_offset_read,
    phantom_value,
    producer_reordered_with_equal_timestamps,
    stale_offset_read,
    stale_poll_at_an_acked_offset,
    two_leaders_in_term_1,
    with_offsets,
)


def test_a_clean_run_passes_every_check() -> None:
    result = with_offsets(clean().finish()).check()
    assert result.verdict == "PASS" and result.violations == [] and result.failed_checks == []
    d = result.to_dict()
    for key in ("lost", "lost_on_replica_max", "replica_divergences", "inconsistent_offsets",
                "duplicates_protocol", "duplicates_retry", "unexpected", "failed_but_read", "recovered",
                "order_producer", "order_realtime", "order_consumer"):
        assert d[key] == 0, key
    assert d["lost_on_replica"] == {"n1": 0, "n2": 0, "n3": 0}
    assert (d["attempted"], d["ok"], d["fail"], d["info"], d["pending"]) == (9, 7, 1, 1, 0)
    assert d["trace_problems"] == [] and d["max_leaders_per_term"] == 1
    assert d["examples"] == {} and d["verdict"] == "PASS"


def test_to_dict_is_json_and_has_the_keys_the_report_reads() -> None:
    r = clean()
    r.send("p1", 0, store=False)  # lost, to get examples and details into the dict
    d = r.finish().check(allow_loss=True).to_dict()
    assert json.loads(json.dumps(d)) == d
    for key in ("verdict", "violations", "attempted", "ok", "fail", "info", "lost", "lost_on_replica",
                "lost_on_replica_max", "unexpected", "failed_but_read", "recovered", "duplicates_protocol",
                "duplicates_retry", "inconsistent_offsets", "order_producer", "order_realtime",
                "order_consumer", "replica_divergences", "trace_problems", "max_leaders_per_term", "terms",
                "elections", "leader_changes", "leader_timeline", "latency_ms", "longest_gap_s",
                "recovery_s", "time_to_next_ack_s", "ack_rate_healthy", "ack_rate_fault", "info_share"):
        assert key in d, key
    assert d["examples"]["lost"][0]["value"] == "p1-4"
    assert d["details"]["lost"]["per_producer"] == {"p1": {"prefix": 0, "middle": 0, "postfix": 1}}


CASES: list[tuple[str, Callable[[], Run], dict[str, Any], set[str]]] = [
    ("lost", lost_with_no_replica_dumps, {}, {"lost"}),
    ("lost-implies-lost-on-replica", lost_with_dumps, {}, {"lost", "lost_on_replica"}),
    ("lost_on_replica", missing_from_every_replica_but_polled, {}, {"lost_on_replica"}),
    ("replica_divergences", one_replica_shorter, {}, {"replica_divergences"}),
    ("inconsistent_offsets", stale_poll_at_an_acked_offset, {}, {"inconsistent_offsets"}),
    ("duplicates_protocol", acked_value_stored_twice, {}, {"duplicates_protocol"}),
    ("unexpected", phantom_value, {}, {"unexpected"}),
    ("failed_but_read", failed_send_read, {}, {"failed_but_read"}),
    ("order_producer", producer_reordered_with_equal_timestamps, {}, {"order_producer"}),
    ("order_realtime", later_send_of_another_producer_gets_a_smaller_offset, {}, {"order_realtime"}),
    ("order_consumer", consumer_skips_ahead, {}, {"order_consumer"}),
    ("raft_traces", two_leaders_in_term_1, {}, {"raft_traces"}),
    ("stale_reads", stale_offset_read, {}, {"stale_reads"}),
    ("phantom_offsets", phantom_offset_read, {}, {"phantom_offsets"}),
    ("leader_churn", lambda: clean().finish(), {"max_leader_changes": 0}, {"leader_churn"}),
]


@pytest.mark.parametrize(("make", "kw", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_seeded_anomaly_fires_exactly_its_check(make: Callable[[], Run], kw: dict[str, Any],
                                                  expected: set[str]) -> None:
    result = make().check(**kw)
    assert fired(result) == expected
    assert result.verdict == "FAIL"
    prefix = {"leader_churn": "leader churn"}  # the one violation worded as prose
    assert {v.split(":")[0] for v in result.violations} == {prefix.get(e, e) for e in expected}


def test_every_safety_check_has_a_seeded_anomaly() -> None:
    covered = set().union(*(c[3] for c in CASES))
    assert covered == {*checker.SAFETY, "lost_on_replica", "raft_traces", "leader_churn"}
