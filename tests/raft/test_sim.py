"""The deterministic simulator in CI: a time-boxed sweep over 3- and 5-node groups must find no
violation, and every canary (a seeded bug) must be caught. Budgets come from the environment:
DLEDGER_SIM_BUDGET_S (sweep, default 240) and DLEDGER_CANARY_BUDGET_S (each canary, default 300;
each stops at its first catch).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from chaos.sim import CANARIES, run_seed, sweep

SWEEP_BUDGET_S = float(os.environ.get("DLEDGER_SIM_BUDGET_S", "240"))
CANARY_BUDGET_S = float(os.environ.get("DLEDGER_CANARY_BUDGET_S", "300"))
SWEEP_SEEDS = int(os.environ.get("DLEDGER_SIM_SEEDS", "500"))  # per group size
MIN_SEEDS = 500


@pytest.mark.slow
def test_sim_sweep_3_and_5_nodes_finds_no_violation(ran: Callable[[str], None]) -> None:
    jobs = [(seed, size, None) for seed in range(SWEEP_SEEDS) for size in (3, 5)]
    summary = sweep(jobs, SWEEP_BUDGET_S, workers=2)
    ran(summary.line())
    assert not summary.failures, "\n\n".join(r.report() for r in summary.failures[:3])
    assert summary.ran >= min(MIN_SEEDS, len(jobs)), f"only {summary.ran} seeds ran in the budget"
    assert summary.acked > summary.ran * 10, "too few proposals were acknowledged to mean much"


@pytest.mark.slow
@pytest.mark.parametrize("canary", sorted(CANARIES))
def test_sim_catches_canary(canary: str, ran: Callable[[str], None]) -> None:
    jobs = [(seed, size, canary) for seed in range(5000) for size in (3, 5)]
    summary = sweep(jobs, CANARY_BUDGET_S, workers=2, stop_on_failure=True)
    caught = summary.failures[0] if summary.failures else None
    ran(f"canary {canary}: "
                 + (f"caught by {caught.invariant} at seed {caught.seed} ({caught.nodes} nodes) "
                    f"after {summary.ran} seeds, {summary.elapsed_s:.1f} s" if caught
                    else f"NOT caught in {summary.ran} seeds"))
    assert caught is not None
    assert caught.replay_command() in caught.report()
    replay = run_seed(caught.seed, caught.nodes, canary)
    assert not replay.ok and replay.invariant == caught.invariant  # the seed replays the failure


def test_sim_a_seed_replays_identically() -> None:
    a = run_seed(11, 5)
    b = run_seed(11, 5)
    assert a.ok and b.ok
    assert (a.events, a.proposed, a.acked, a.trail) == (b.events, b.proposed, b.acked, b.trail)
    assert a.acked > 0 and a.fault_counts
