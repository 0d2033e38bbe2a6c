"""The live chaos report (chaos/live/report/writer.py) on synthetic runs: the tables and verdicts in the
markdown, the JSON round trip, the timeline PNGs, and a failed run's violations."""

from __future__ import annotations

import copy
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chaos.live.report import writer as report

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

META: dict[str, Any] = {
    "commit": "abc1234", "date": "2026-05-09T12:00:00Z", "python": "3.11.7",
    "kernel": "6.1.0-test", "cores": 2, "tick_ms": 100, "election_ticks": 10, "heartbeat_ms": 100,
    "election_timeout_ms": [1000, 2000], "command": "python -m chaos.live run --scenario S1 --seed 7",
}


def make_run(scenario: str = "S1", seed: int = 7, *, verdict: str = "PASS", canary: str | None = None,
             violations: list[str] | None = None, n_acks: int = 600) -> dict[str, Any]:
    rng = random.Random(seed)
    duration = 60.0
    windows = [{"fault": "isolate", "nodes": ["n1"], "start": 12.3, "stop": 20.3},
               {"fault": "kill", "nodes": ["n2"], "start": 35.0, "stop": 38.5},
               {"fault": "isolate", "nodes": ["n3"], "start": 45.0, "stop": 53.0}]
    acks = sorted([[round(rng.uniform(0, duration), 3), round(rng.lognormvariate(2.5, 0.8), 2)]
                   for _ in range(n_acks)])
    return {
        "scenario": scenario, "title": "Leader isolation", "seed": seed, "nodes": 3,
        "flush_mode": "sync", "canary": canary, "duration_s": duration, "wall_s": 95.2,
        "faults": {"isolate": 2, "kill": 1, "pause": 0},
        "fault_windows": windows,
        "durability": {"power_loss_events": 2, "bytes_discarded": 12345, "corruption_events": 0,
                       "corrupt_node_became_leader": False},
        "check": {
            "attempted": 620, "ok": n_acks, "fail": 12, "info": 8,
            "lost": 0 if verdict == "PASS" else ["p1-17", "p2-3", "p3-9"],
            "lost_on_replica": {"n1": 0, "n2": 2 if verdict == "FAIL" else 0, "n3": 0},
            "unexpected": [], "failed_but_read": 0, "recovered": 3,
            "duplicates_protocol": 0, "duplicates_retry": [["p1-4", 2]],
            "inconsistent_offsets": 0, "order_producer": 0, "order_realtime": 0,
            "order_consumer": 0, "replica_divergences": 0, "trace_problems": [],
            "max_leaders_per_term": 1, "terms": 4, "leader_changes": 3,
            "latency_ms": {"p50": 12.5, "p95": 48.0, "p99": 130.25},
            "longest_gap_s": 2.75, "recovery_s": 1.4,
            "time_to_next_ack_s": {"isolate": {"median": 2.1, "values": [1.9, 2.3]},
                                   "kill": {"median": 3.4, "values": [3.4]}},
            "ack_rate_healthy": 11.5, "ack_rate_fault": 6.25, "info_share": 0.0129,
        },
        "series": {"acks": acks,
                   "fails": [[13.0, "fail"], [13.5, "info"], [36.0, "fail"], [46.2, "info"]],
                   "leaders": [[1.2, "n1", 1], [14.1, "n2", 2], [36.8, "n3", 3], [47.0, "n1", 4]]},
        "verdict": verdict, "violations": violations or [],
        "expect": "fail" if canary else "pass", "notes": ["synthetic run"],
    }


FAIL_VIOLATIONS = [f"lost acknowledged message p1-{i} at offset {100 + i} (term 2, node n1)"
                   for i in range(14)]


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    return [
        make_run("S1", 7),
        make_run("S1", 7, verdict="FAIL", canary="ack_before_commit", violations=FAIL_VIOLATIONS),
        make_run("S6", 3, verdict="FAIL", violations=["inconsistent offset 42: 'p1-1' vs 'p2-9'"]),
    ]


@pytest.fixture(scope="module")
def written(runs: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    before = copy.deepcopy(runs)
    md = report.write_report(runs, META, out)
    assert runs == before, "write_report must not change its input"
    return md


def test_markdown_has_every_table_and_the_how_to_read_paragraph(runs: list[dict[str, Any]]) -> None:
    md = report.render_markdown(runs, META)
    for heading in ("## Run metadata", "## Safety", "## Leadership", "## Availability and latency",
                    "## Durability faults", "## Canary matrix", "## Runs"):
        assert heading in md
    assert "How to read this" in md and "must be 0" in md and "not pass/fail" in md
    # metadata
    assert "| commit | abc1234 |" in md
    assert "| election timeout | 1000–2000 ms |" in md
    assert "| seeds | 3, 7 |" in md
    assert "`python -m chaos.live run --scenario S1 --seed 7`" in md
    # safety row of the passing run: faults by type (zeros left out), lists counted, pairs
    assert "isolate×2, kill×1" in md and "pause×" not in md
    safety = md.split("## Safety")[1].split("## Leadership")[0]
    pass_row = next(line for line in safety.splitlines() if line.startswith("| S1 |")
                    and "| PASS |" in line)
    assert "| 620 | 600 | 12 | 8 | 0 | 0 | 0 |" in pass_row
    assert "| 0 / 1 |" in pass_row  # duplicates protocol / retry (a list counts its items)
    assert "| 0 / 0 / 0 |" in pass_row  # order violations
    # availability: measurements rendered with units
    assert "11.50 / 6.25" in md and "12.50 / 48.00 / 130.25" in md
    assert "isolate 2.10 s (n=2), kill 3.40 s (n=1)" in md and "1.3 %" in md
    # leadership and durability
    assert "| S1 | 7 | 4 | 4 | 3 | 3.00 |" in md
    assert "| 12345 |" in md


def test_verdicts_expected_failures_and_the_canary_matrix(runs: list[dict[str, Any]]) -> None:
    md = report.render_markdown(runs, META)
    assert "FAIL (expected) – caught" in md
    assert "**FAIL**" in md  # the S6 run was expected to pass
    assert "did not end as expected: S6/seed3" in md
    assert "canaries caught 1/1" in md
    canary = md.split("## Canary matrix")[1].split("## Runs")[0]
    assert "`ack_before_commit`" in canary and "| S1 / 7 |" in canary and "| yes |" in canary
    assert FAIL_VIOLATIONS[0] in canary  # the detector is the first violation


def test_a_canary_that_passes_is_reported_as_not_caught() -> None:
    md = report.render_markdown([make_run(canary="no_fsync", verdict="PASS")], META)
    assert "NOT caught" in md and "| **NO** |" in md


def test_a_failed_run_shows_its_first_ten_violations(runs: list[dict[str, Any]]) -> None:
    md = report.render_markdown(runs, META)
    section = md.split("### S1 Leader isolation — seed 7 — FAIL")[1].split("### ")[0]
    assert "Violations (first 10 of 14)" in section
    for v in FAIL_VIOLATIONS[:10]:
        assert v in section
    for v in FAIL_VIOLATIONS[10:]:
        assert v not in md
    assert "inconsistent offset 42: 'p1-1' vs 'p2-9'" in md
    assert "Lost on replica: n1 0, n2 2, n3 0" in section
    passing = md.split("### S1 Leader isolation — seed 7 — PASS")[1].split("### ")[0]
    assert "Violations" not in passing


def test_missing_checker_keys_render_as_a_dash() -> None:
    run = {"scenario": "S0", "seed": 1, "verdict": "PASS", "check": {}}
    md = report.render_markdown([run], {})
    safety = md.split("## Safety")[1].split("## Leadership")[0]
    row = next(line for line in safety.splitlines() if line.startswith("| S0 |"))
    assert row.count("–") >= 15
    assert "| PASS |" in row
    assert "No canary runs." in md


def test_the_transactional_table_shows_its_counts_and_an_unresolved_run() -> None:
    txn = {"sent": 106, "halves": 104, "committed": 63, "rolled_back": 41,
           "resolved_by_check": 60, "resolved_for_another": 46, "producer_kills": 5,
           "killed_mid_send": 2, "redeliveries": {"a": 0, "b": 3}, "check_max_rollbacks": 0,
           "resolved_in_s": 5.1, "bound_s": 17.0, "violations": 0}
    runs = [{"scenario": "S1", "seed": 1, "verdict": "PASS", "features": {"txn": txn}},
            {"scenario": "S6", "seed": 1, "verdict": "FAIL", "canary": "txn_forget",
             "features": {"txn": {**txn, "resolved_in_s": None, "violations": 7}}},
            {"scenario": "S8", "seed": 1, "verdict": "PASS", "features": {}}]
    md = report.render_markdown(runs, {})
    table = md.split("### Transactional messages")[1].split("## Canary matrix")[0]
    rows = [line for line in table.splitlines() if line.startswith("| S")]
    assert len(rows) == 2  # a run without the transactional feature has no row
    assert "| 106 / 104 | 63 / 41 | 60 (46) | 5 (2) | 0 / 3 | 0 | 5.1 s (17 s) | 0 | PASS |" \
        in rows[0]
    assert "**never** (17 s) | 7 |" in rows[1]


def test_write_report_writes_markdown_json_and_one_png_per_run(
        written: Path, runs: list[dict[str, Any]]) -> None:
    out = written.parent
    assert written == out / "report.md"
    assert written.read_text(encoding="utf-8") == report.render_markdown(runs, META)
    names = report.png_names(runs)
    assert names == ["S1-seed7.png", "S1-seed7-ack_before_commit.png", "S6-seed3.png"]
    for name in names:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC
        assert len(data) < 150_000
        assert f"]({name})" in written.read_text(encoding="utf-8")


def test_report_json_round_trips(written: Path, runs: list[dict[str, Any]]) -> None:
    doc = json.loads((written.parent / "report.json").read_text(encoding="utf-8"))
    assert doc["meta"] == META
    # everything but the raw per-send series (drawn in the PNGs, kept in each history.jsonl)
    assert doc["runs"] == [{k: v for k, v in r.items() if k != "series"} for r in runs]
    assert doc["summary"]["runs"] == 3 and doc["summary"]["unexpected"] == ["S6/seed3"]
    assert doc["images"] == report.png_names(runs)


def test_a_sparse_run_still_plots(tmp_path: Path) -> None:
    path = tmp_path / "empty.png"
    report.plot_timeline({"scenario": "S0", "seed": 1, "verdict": "PASS",
                          "fault_windows": [{"fault": "pause", "nodes": ["n1"], "start": 2.0,
                                             "stop": None}]}, path)
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_importing_the_module_does_not_import_matplotlib() -> None:
    code = "import sys, chaos.live.report.writer; print('matplotlib' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
