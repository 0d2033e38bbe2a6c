"""Live chaos on real processes (CHAOS.md layer L2): the CI subset of scenarios must pass with zero
safety violations, and every seeded bug must be caught by its scenario.

Each run starts a NameServer, a fault proxy and a 3-node broker group, drives producers and
consumers through the real client library, injects the scenario's faults, heals, drains every
replica and checks the history offline. Budget: DLEDGER_CHAOS_DURATION_S seconds of faults per
run (default 30); about 50-80 s of wall time per run. The full matrix is ``dledger chaos run
--all --canaries`` (docs/chaos/report.md).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from chaos.live.nemesis import CANARIES, CI_SUBSET
from chaos.live.runner import RunConfig, run_scenario

pytestmark = pytest.mark.slow

DURATION_S = float(os.environ.get("DLEDGER_CHAOS_DURATION_S", "30"))
SEED = int(os.environ.get("DLEDGER_CHAOS_SEED", "1"))

# What each seeded bug must break (the names of the checks that fire, see chaos/live/checker.py).
CANARY_DETECTORS = {
    "commit_without_quorum": ("lost", "lost_on_replica", "replica_divergences"),
    "async_flush_ack": ("lost", "lost_on_replica"),
    "no_pre_vote_check_quorum": ("leader churn",),
    "skip_checksum": ("replica_divergences", "unexpected", "crash", "lost_on_replica"),
}


def _run(tmp_path: Path, scenario: str, canary: str | None = None) -> dict[str, Any]:
    lines: list[str] = []
    cfg = RunConfig(scenario, SEED, DURATION_S, str(tmp_path), canary, quiet_s=3.0,
                    recovery_s=5.0)
    run = asyncio.run(run_scenario(cfg, say=lines.append))
    print("\n".join(lines))  # the fault timeline, shown when a run fails
    return run


@pytest.mark.parametrize("scenario", CI_SUBSET)
def test_scenario_has_no_safety_violation(scenario: str, tmp_path: Path) -> None:
    run = _run(tmp_path, scenario)
    check = run["check"]
    assert run["violations"] == [], "\n".join(run["violations"][:10])
    assert run["faults"], "the schedule injected no fault"
    assert check["ok"] > 100, "too little was acknowledged to prove anything"
    assert check["lost"] == 0 and check["max_leaders_per_term"] <= 1
    if scenario == "S12":  # power loss of every node at once, in sync flush mode
        assert run["durability"]["power_loss_events"] >= 3


@pytest.mark.parametrize("canary", sorted(CANARIES))
def test_seeded_bug_is_caught_by_its_scenario(canary: str, tmp_path: Path) -> None:
    scenario = CANARIES[canary][0]
    run = _run(tmp_path, scenario, canary)
    assert run["verdict"] == "FAIL", f"canary {canary} was not caught by {scenario}"
    fired = [v for v in run["violations"] if v.startswith(CANARY_DETECTORS[canary])]
    assert fired, f"{canary}: expected {CANARY_DETECTORS[canary]}, got {run['violations'][:5]}"
