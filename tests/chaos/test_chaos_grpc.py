"""Live chaos with RocketMQ 5 clients over gRPC (issue 35, item 7): the official Python client
(``chaos.live.grpc_load``) sends NORMAL, FIFO (four message groups) and batch messages through
the nodes' gRPC endpoints and receives with SimpleConsumers, beside two of our producers, while
the leader is killed (S19) or isolated (S20). The pop/FIFO checker finds no acknowledged send
lost, none received after its ack, never two of one message group in flight and each group in
order; the batch checker every batch wholly stored or absent; the safety and registration
checkers nothing. Their canaries (``fifo_group_overlap``, ``grpc_batch_torn``: S19's) are caught
by the same checkers in ``tests/chaos/test_chaos_canaries.py``; the last test here runs them
too, so that this file alone proves the bar's line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from chaos.live.nemesis import CANARIES
from tests.chaos.live_runs import CANARY_DETECTORS, FEATURE_CANARY_DURATION_S, GRPC_CANARIES, run_live

pytestmark = pytest.mark.slow

GRPC_DURATION_S = 16.0  # S19: a kill 10 s in; S20: an isolation from 7 s to 15 s


@pytest.mark.parametrize(("scenario", "fault"), [("S19", "kill"), ("S20", "isolate")])
def test_rocketmq_5_clients_lose_nothing_and_keep_fifo_while_the_leader_fails(
        scenario: str, fault: str, tmp_path: Path, ran: Callable[[str], None]) -> None:
    run = run_live(tmp_path, scenario, duration_s=GRPC_DURATION_S, ran=ran)
    assert run["verdict"] == "PASS", run["violations"][:10]
    assert run["faults"].get(fault, 0) >= 1, run["faults"]
    g = run["grpc"]
    assert g["caught_up"], g  # every acknowledged send was received and acked
    assert g["sent"] > 200 and g["fifo_deliveries"] > 50, g  # enough to prove anything
    assert g["sent_after_fault"] > 50 and g["fifo_after_fault"] > 20, g  # through the faults
    assert g["fifo_parallel"] > 0, g  # the message groups proceeded at once
    assert g["batches_acked"] > 20 and g["batches_stored"] >= g["batches_acked"], g


@pytest.mark.parametrize("canary", GRPC_CANARIES)
def test_the_grpc_canaries_are_caught_by_their_checkers(
        canary: str, tmp_path: Path, ran: Callable[[str], None]) -> None:
    scenario = CANARIES[canary][0]
    run = run_live(tmp_path, scenario, canary, duration_s=FEATURE_CANARY_DURATION_S, ran=ran)
    assert run["verdict"] == "FAIL", f"canary {canary} was not caught by {scenario}"
    fired = [v for v in run["violations"] if v.startswith(CANARY_DETECTORS[canary])]
    assert fired, f"{canary}: expected {CANARY_DETECTORS[canary]}, got {run['violations'][:5]}"
