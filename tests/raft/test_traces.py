"""The offline trace checker fires on each broken invariant (and stays quiet on a good trace)."""

from __future__ import annotations

import json
from pathlib import Path

from chaos import traces


def ev(node: str, kind: str, **kw) -> dict:
    return {"node": node, "t": 0, "ev": kind, **kw}


GOOD = [ev("n1", "start"), ev("n1", "role", term=1, role="leader"), ev("n1", "vote", term=1, voted_for="n1"),
        ev("n1", "commit", index=1, term=1, crc=7), ev("n2", "start"),
        ev("n2", "role", term=1, role="follower"), ev("n2", "commit", index=1, term=1, crc=7)]


def test_a_good_trace_passes() -> None:
    assert traces.check(GOOD) == []


def test_two_leaders_in_one_term_are_reported() -> None:
    bad = [*GOOD, ev("n2", "role", term=1, role="leader")]
    assert any("term 1 had leaders" in p for p in traces.check(bad))


def test_a_term_going_back_across_a_restart_is_reported() -> None:
    bad = [*GOOD, ev("n1", "start"), ev("n1", "role", term=0, role="follower")]
    assert any("term went back" in p for p in traces.check(bad))


def test_two_votes_in_one_term_are_reported() -> None:
    bad = [*GOOD, ev("n1", "start"), ev("n1", "vote", term=1, voted_for="n2")]
    assert any("voted for" in p for p in traces.check(bad))


def test_a_changed_committed_entry_is_reported() -> None:
    bad = [*GOOD, ev("n3", "commit", index=1, term=2, crc=9)]
    assert any("committed" in p for p in traces.check(bad))


def test_commit_going_back_within_a_life_is_reported_but_not_across_restarts() -> None:
    back = [*GOOD, ev("n1", "commit", index=0, term=0, crc=0)]
    assert any("went back" in p for p in traces.check(back))
    restart = [*GOOD, ev("n1", "start"), ev("n1", "commit", index=1, term=1, crc=7)]
    assert traces.check(restart) == []


def test_load_reports_unreadable_lines(tmp_path: Path) -> None:
    path = tmp_path / "n1.trace"
    path.write_text(json.dumps(GOOD[0]) + "\n{not json\n")
    assert any("unreadable" in p for p in traces.check(traces.load([path])))
