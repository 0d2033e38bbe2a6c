"""Live chaos, S17: nodes added and removed one at a time while members are killed and isolated;
with a restarted node forgetting the changes its log holds, the checkers find the split brain."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.chaos.live_runs import CANARY_DETECTORS, DURATION_S, run_live

pytestmark = pytest.mark.slow


# S17 needs a minute of faults for its canary: the forgetful restarts must hit removed nodes
# still running (3 of 3 seeds caught at 60 s on 2026-12-05; seed 1 at 30 s was not).
MEMBERSHIP_CANARY_DURATION_S = max(DURATION_S, 60.0)


MEMBERSHIP_SEED = int(os.environ.get("DLEDGER_CHAOS_MEMBERSHIP_SEED", "3"))
# Whether a forgetful restart meets a removed node still running depends on the live timing, not
# on the seed alone: seed 3 caught it in 7 of 7 runs alone on 2026-12-07 but missed it in 7 of
# 19 fresh-clone CI runs (four loaded workers), where seed 4, each time run after such a miss,
# caught it 7 of 7 times. The canary starts at seed 4; a miss is run again on the next seeds.
CANARY_SEED = MEMBERSHIP_SEED + 1
CANARY_TRIES = 3


@pytest.mark.parametrize("canary", [None, "membership_forget_on_restart"])
def test_membership_changes_under_kills_and_isolation(canary: str | None, tmp_path: Path,
                                                      ran: Callable[[str], None]) -> None:
    """S17 (issue 19, item 6): nodes added and removed one at a time while members are killed
    and isolated, removed nodes left running; the usual checkers find nothing. With a restarted
    node forgetting the changes its log holds, they find the split brain it causes."""
    if canary is None:
        run = run_live(tmp_path, "S17", None, duration_s=DURATION_S, ran=ran, seed=MEMBERSHIP_SEED)
        assert run["violations"] == [], "\n".join(run["violations"][:10])
        assert run["faults"].get("add-node", 0) >= 1 and run["faults"].get("remove-node", 0) >= 1
        assert run["check"]["ok"] > 100 and run["check"]["lost"] == 0
        return
    for attempt in range(CANARY_TRIES):
        run = run_live(tmp_path / f"try{attempt}", "S17", canary, ran=ran,
                       duration_s=MEMBERSHIP_CANARY_DURATION_S, seed=CANARY_SEED + attempt)
        if run["verdict"] == "FAIL":
            break
    assert run["verdict"] == "FAIL", f"canary {canary} was not caught by S17 in {CANARY_TRIES} runs"
    fired = [v for v in run["violations"] if v.startswith(CANARY_DETECTORS[canary])]
    assert fired, f"{canary}: expected {CANARY_DETECTORS[canary]}, got {run['violations'][:5]}"
