"""The live chaos run's liveness figures (chaos/live/checkers/availability.py): leadership and
its timeline, leader churn within the bound, ack availability, time to the next ack, percentiles."""

from __future__ import annotations

import asyncio

import pytest

from chaos.live.checkers.availability import availability, leadership, percentile
from chaos.live.runner import HarnessError, _wait
from tests.chaos.checker_runs import T0, Run, clean, offset_op, two_leaders_in_term_1, with_offsets


def test_leadership_counts_terms_elections_and_builds_a_timeline() -> None:
    lead = leadership(clean().finish().traces)
    assert (lead["terms"], lead["elections"], lead["leader_changes"], lead["max_leaders_per_term"]) \
        == (2, 2, 1, 1)
    assert [e[1:] for e in lead["leader_timeline"]] == [["n1", 1], ["n2", 2]]
    assert lead["leader_timeline"][1][0] == pytest.approx(T0 + 0.45)
    assert leadership(two_leaders_in_term_1().traces)["multi_leader_terms"] == {1: ["n1", "n3"]}


def test_leader_churn_within_the_bound_passes() -> None:
    assert clean().finish().check(max_leader_changes=1).verdict == "PASS"


def test_availability_of_the_clean_run() -> None:
    a = availability(clean().finish().history)
    assert (a["attempted"], a["ok"], a["fail"], a["info"]) == (9, 7, 1, 1)
    assert a["info_share"] == pytest.approx(1 / 9)
    assert a["latency_ms"]["p50"] == pytest.approx(10.0) and a["latency_ms"]["p99"] == pytest.approx(10.0)
    # acks at +0.01 .11 .21 .31 .51 .91, heal at +1.0: the longest gap is .51 -> .91
    assert a["longest_gap_s"] == pytest.approx(0.4)
    assert a["longest_gap"]["start"] == pytest.approx(T0 + 0.51)
    assert a["recovery_s"] == pytest.approx(0.11)  # heal at +1.0, p0-4 invoked +1.1, acked +1.11
    assert a["time_to_next_ack_s"]["isolate"]["values"] == [pytest.approx(0.11)]
    assert a["fault_s"] == pytest.approx(0.4)
    assert a["ack_rate_fault"] == pytest.approx(1 / 0.4)  # one ack inside [+0.4, +0.8)
    assert a["ack_rate_healthy"] == pytest.approx(5 / 0.6)


def test_time_to_next_ack_skips_acks_from_the_faulted_node() -> None:
    r = Run()
    r.send("p0", 0)
    r.nemesis("start", "isolate", ("n1",))  # +0.1
    r.send("p0", 0)  # still answered by n1 (a zombie leader): does not count
    r.leader = "n2"
    r.send("p0", 0)  # +0.3, acked +0.31
    r.nemesis("start", "kill", ("n3",))
    r.nemesis("heal")
    a = availability(r.history)
    assert a["time_to_next_ack_s"]["isolate"]["median"] == pytest.approx(0.21)
    assert a["time_to_next_ack_s"]["kill"] == {"values": [], "median": None, "never": 1}
    assert a["recovery_s"] is None  # nothing was sent after the heal


def test_percentile_is_nearest_rank() -> None:
    xs = [float(x) for x in range(1, 101)]
    assert (percentile(xs, 50), percentile(xs, 95), percentile(xs, 99)) == (50.0, 95.0, 99.0)
    assert percentile([], 50) is None and percentile([3.0], 99) == 3.0


def test_a_read_concurrent_with_a_commit_may_return_the_older_offset() -> None:
    r = with_offsets(clean().finish())
    r.history.append({"proc": "c1", "f": "offset-read", "group": "g0", "queue": 0, "op": 9,
                      "type": "invoke", "value": None, "t": r.t})
    offset_op(r, "offset-commit", 7, op=10)  # acknowledged after the read began
    r.history.append({"proc": "c1", "f": "offset-read", "group": "g0", "queue": 0, "op": 9,
                      "type": "ok", "value": 5, "t": r.t})
    assert r.check().verdict == "PASS"


def test_a_wait_whose_progress_stands_still_ends_before_its_bound() -> None:
    """The runner's catch-up wait (``chaos.live.runner._wait``): a condition never met whose
    progress mark stays the same ends as a wait that ran out, after the stall bound; one whose
    mark keeps moving runs to the full bound; one met returns."""
    ticks = [0]

    async def never() -> bool:
        ticks[0] += 1
        return False

    async def soon() -> bool:
        ticks[0] += 1
        return ticks[0] >= 3

    with pytest.raises(HarnessError, match=r"no progress for 0\.3 s .* waiting for x"):
        asyncio.run(_wait(never, 60, "x", progress=lambda: "same", stall_s=0.3))
    with pytest.raises(HarnessError, match=r"timed out after 0\.5 s waiting for y"):
        asyncio.run(_wait(never, 0.5, "y", progress=lambda: ticks[0], stall_s=0.3))
    ticks[0] = 0
    assert asyncio.run(_wait(soon, 60, "z", progress=lambda: "same", stall_s=30)) >= 0
