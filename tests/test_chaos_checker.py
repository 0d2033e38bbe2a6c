"""The live chaos checkers (chaos/live/checkers/safety.py, chaos/live/checkers/availability.py) on small synthetic
runs: a clean run passes every check, and for each check one seeded anomaly makes exactly that
check fire (the checkers can fail), while informational findings never fail a run."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from chaos.live.checkers import safety as checker
from chaos.live.checkers.availability import availability, leadership, percentile
from chaos.live.checkers.safety import check_run

T0 = 1_000.0
LAT = 0.01  # every ack comes 10 ms after its invoke
STEP = 0.1  # one operation every 100 ms
NODES = ("n1", "n2", "n3")


def ns(t: float) -> int:
    return int(round(t * 1e9))


@dataclass
class Run:
    """A tiny broker model: records the history and derives polls, replica dumps, drain and traces."""

    history: list[dict[str, Any]] = field(default_factory=list)
    queues: dict[int, list[str]] = field(default_factory=lambda: {0: [], 1: []})
    seq: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    t: float = T0
    leader: str = "n1"
    replicas: dict[str, dict[int, list[tuple[int, str]]]] = field(default_factory=dict)
    drain: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    traces: list[dict[str, Any]] = field(default_factory=list)

    def send(self, proc: str, queue: int, outcome: str = "ok", *, store: bool | None = None,
             offset: int | None = None, at: float | None = None) -> str:
        t = self.t if at is None else at
        value = f"{proc}-{self.seq[proc]}"
        self.seq[proc] += 1
        self.history.append({"proc": proc, "type": "invoke", "f": "send", "value": value, "t": t})
        pos = len(self.queues[queue]) if offset is None else offset
        if outcome == "ok" if store is None else store:
            self.queues[queue].append(value)
        done: dict[str, Any] = {"proc": proc, "type": outcome, "f": "send", "value": value, "t": t + LAT}
        if outcome == "ok":
            done.update(queue=queue, offset=pos, node=self.leader)
        else:
            done["error"] = "timeout" if outcome == "info" else "NOT_LEADER"
        self.history.append(done)
        self.t = max(self.t, t) + STEP
        return value

    def nemesis(self, f: str, fault: str | None = None, nodes: tuple[str, ...] = ()) -> None:
        ev: dict[str, Any] = {"proc": "nemesis", "type": "info", "f": f, "t": self.t}
        if fault is not None:
            ev.update(fault=fault, nodes=list(nodes))
        self.history.append(ev)
        self.t += STEP

    def poll(self, proc: str, queue: int, session: int, start: int, n: int | None = None,
             ok: bool = True) -> None:
        ev: dict[str, Any] = {"proc": proc, "type": "ok" if ok else "fail", "f": "poll", "queue": queue,
                              "from": start, "session": session, "t": self.t}
        if ok:
            vals = self.queues[queue][start:] if n is None else self.queues[queue][start:start + n]
            ev.update(values=[[start + i, v] for i, v in enumerate(vals)], node=self.leader)
        else:
            ev["error"] = "timeout"
        self.history.append(ev)
        self.t += STEP

    def finish(self) -> Run:
        for q in self.queues:  # consumer c<q>: tail-follow in pairs, a failed poll, then a re-read
            start = 0
            while start < len(self.queues[q]):
                self.poll(f"c{q}", q, 0, start, 2)
                start = min(start + 2, len(self.queues[q]))
            self.poll(f"c{q}", q, 0, start, ok=False)
            self.poll(f"c{q}", q, 0, start)
            self.poll(f"c{q}", q, 1, 0)
        dump = {q: list(enumerate(vs)) for q, vs in self.queues.items()}
        self.replicas = {n: {q: list(es) for q, es in dump.items()} for n in NODES}
        self.drain = {q: list(es) for q, es in dump.items()}
        ev = [{"node": n, "t": ns(T0 - 1), "ev": "start"} for n in NODES]
        ev += [{"node": n, "t": ns(T0 - 0.5), "ev": "role", "term": 1,
                "role": "leader" if n == "n1" else "follower"} for n in NODES]
        ev += [{"node": n, "t": ns(T0 - 0.6), "ev": "vote", "term": 1, "voted_for": "n1"} for n in NODES]
        ev += [{"node": n, "t": ns(T0), "ev": "commit", "index": 1, "term": 1, "crc": 7} for n in NODES]
        ev += [{"node": "n2", "t": ns(T0 + 0.45), "ev": "role", "term": 2, "role": "leader"},
               {"node": "n3", "t": ns(T0 + 0.46), "ev": "role", "term": 2, "role": "follower"},
               {"node": "n1", "t": ns(T0 + 0.85), "ev": "role", "term": 2, "role": "follower"},
               {"node": "n2", "t": ns(T0 + 0.5), "ev": "commit", "index": 2, "term": 2, "crc": 9}]
        self.traces = ev
        return self

    def check(self, **kw: Any) -> checker.CheckResult:
        return check_run(self.history, self.replicas, self.drain, self.traces, **kw)

    def everywhere(self, queue: int, value: str) -> None:
        """Append ``value`` at the end of ``queue`` in every replica and the drain (not the polls)."""
        for dump in [*self.replicas.values(), self.drain]:
            dump[queue].append((len(dump[queue]), value))


def clean() -> Run:
    """p0-0 p1-0 -> q0, p0-1 p1-1 -> q1; isolate n1; p0-2 -> q0 via n2, p1-2 fails, p0-3 is info
    (not stored); stop; p1-3 -> q0; heal; p0-4 -> q1."""
    r = Run()
    r.send("p0", 0), r.send("p1", 0), r.send("p0", 1), r.send("p1", 1)
    r.nemesis("start", "isolate", ("n1",))  # T0+0.4
    r.leader = "n2"
    r.send("p0", 0), r.send("p1", 1, "fail"), r.send("p0", 1, "info")
    r.nemesis("stop", "isolate", ("n1",))  # T0+0.8
    r.send("p1", 0)
    r.nemesis("heal")  # T0+1.0
    r.send("p0", 1)  # T0+1.1
    return r


def offset_op(r: Run, f: str, value: int, kind: str = "ok", op: int = 0,
              invoke: bool = True) -> None:
    """One consumer-offset commit or read-back (group g0, queue 0) at the run's clock."""
    base = {"proc": "c0", "f": f, "group": "g0", "queue": 0, "op": op}
    if invoke:
        r.history.append({**base, "type": "invoke", "value": value, "t": r.t})
        r.t += STEP
    r.history.append({**base, "type": kind, "value": value, "t": r.t})
    r.t += STEP


def with_offsets(r: Run) -> Run:
    """Commit 2 then 5, reading back after each (and once before any commit: -1)."""
    offset_op(r, "offset-read", -1, op=0)
    offset_op(r, "offset-commit", 2, op=1)
    offset_op(r, "offset-read", 2, op=2)
    offset_op(r, "offset-commit", 5, op=3)
    offset_op(r, "offset-read", 5, op=4)
    return r


def stale_offset_read() -> Run:
    r = with_offsets(clean().finish())
    offset_op(r, "offset-read", 2, op=5)  # invoked after the commit of 5 was acknowledged
    return r


def phantom_offset_read() -> Run:
    r = with_offsets(clean().finish())
    offset_op(r, "offset-read", 9, op=5)  # nobody ever committed 9
    return r


def fired(result: checker.CheckResult) -> set[str]:
    assert (result.verdict == "FAIL") == bool(result.failed_checks) == bool(result.violations)
    return set(result.failed_checks)


# ------------------------------------------------------------------------------------------------
# The clean run


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


# ------------------------------------------------------------------------------------------------
# One seeded anomaly per check: exactly that check fires


def lost_with_no_replica_dumps() -> Run:
    r = clean()
    r.send("p1", 0, store=False)  # acked at q0 offset 4, stored nowhere
    r.finish()
    r.replicas = {}  # with dumps, a value read nowhere is also missing from every replica
    return r


def lost_with_dumps() -> Run:
    r = clean()
    r.send("p1", 0, store=False)
    return r.finish()


def missing_from_every_replica_but_polled() -> Run:
    r = clean().finish()
    for dump in [*r.replicas.values(), r.drain]:
        dump[0].pop()  # p1-3, which the consumers did read
    return r


def one_replica_shorter() -> Run:
    r = clean()
    r.send("p1", 1, "info", store=True)  # stored (recovered) but n3 never got it
    r.finish()
    r.replicas["n3"][1].pop()
    return r


def stale_poll_at_an_acked_offset() -> Run:
    r = clean()
    ghost = r.send("p1", 1, "info", store=False)
    r.finish()
    for ev in r.history:  # c0 reads q0 offset 1 as the ghost (a deposed leader's divergent log)
        if ev["f"] == "poll" and ev["proc"] == "c0" and ev["type"] == "ok" and ev["session"] == 0:
            ev["values"] = [[o, ghost if o == 1 else v] for o, v in ev["values"]]
    return r


def acked_value_stored_twice() -> Run:
    r = clean().finish()
    r.everywhere(0, "p0-0")
    return r


def phantom_value() -> Run:
    r = clean().finish()
    r.everywhere(1, "p9-0")
    return r


def failed_send_read() -> Run:
    r = clean().finish()
    r.everywhere(1, "p1-2")
    return r


def producer_reordered_with_equal_timestamps() -> Run:
    r = clean()
    end, t = len(r.queues[0]), r.t
    a = r.send("p0", 0, store=False, offset=end + 1, at=t)
    b = r.send("p0", 0, store=False, offset=end, at=t + LAT)  # invoked when a's ack came: not after it
    r.queues[0] += [b, a]
    return r.finish()


def later_send_of_another_producer_gets_a_smaller_offset() -> Run:
    r = clean()
    end = len(r.queues[0])
    a = r.send("p0", 0, store=False, offset=end + 1)
    b = r.send("p1", 0, store=False, offset=end)  # invoked 90 ms after a's ack
    r.queues[0] += [b, a]
    return r.finish()


def consumer_skips_ahead() -> Run:
    r = clean().finish()
    r.poll("c0", 0, 0, len(r.queues[0]) + 1)  # session 0 had reached the end; asks one past it
    return r


def two_leaders_in_term_1() -> Run:
    r = clean().finish()
    r.traces.append({"node": "n3", "t": ns(T0 + 0.2), "ev": "role", "term": 1, "role": "leader"})
    return r


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


# ------------------------------------------------------------------------------------------------
# What each anomaly reports


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


# ------------------------------------------------------------------------------------------------
# Leadership and availability (measurements)


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
