"""Live chaos: every seeded bug (a test-only flag) is caught by its scenario, by the checks it
must break. The messaging features' canaries run in a short form (``FEATURE_CANARY_DURATION_S`` of
faults: each is caught within its first fault). The RocketMQ 5 clients' canaries (S19's) run in
``tests/chaos/test_chaos_grpc.py``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from chaos.live.canaries import CANARIES
from tests.chaos.live_runs import (
    CANARY_DETECTORS,
    CORE_CANARIES,
    DURATION_S,
    FEATURE_CANARY_DURATION_S,
    GRPC_CANARIES,
    SHORT_CANARIES,
    run_live,
)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("canary", sorted(set(CANARIES) - {"stale_leader",  # its own tests below
                                                           "dedup_ignored",  # test_chaos_scenarios
                                                           "membership_forget_on_restart",
                                                           *GRPC_CANARIES}))  # test_chaos_grpc
def test_seeded_bug_is_caught_by_its_scenario(canary: str, tmp_path: Path,
                                             ran: Callable[[str], None]) -> None:
    scenario = CANARIES[canary][0]
    duration_s = FEATURE_CANARY_DURATION_S if canary in SHORT_CANARIES else DURATION_S
    run = run_live(tmp_path, scenario, canary, duration_s=duration_s, ran=ran,
                   features=False if canary in CORE_CANARIES else None)
    assert run["verdict"] == "FAIL", f"canary {canary} was not caught by {scenario}"
    fired = [v for v in run["violations"] if v.startswith(CANARY_DETECTORS[canary])]
    assert fired, f"{canary}: expected {CANARY_DETECTORS[canary]}, got {run['violations'][:5]}"
