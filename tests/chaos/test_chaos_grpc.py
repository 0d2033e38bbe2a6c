"""Live chaos with RocketMQ 5 clients over gRPC (issue 35, item 7): the official Python client
(``chaos.live.grpc_load``) sends NORMAL, FIFO (four message groups) and batch messages through
the nodes' gRPC endpoints and receives with SimpleConsumers, beside two of our producers, while
the leader is killed (S19) or isolated (S20); and delayed messages, half of them recalled, and
messages with a TTL for a slow consumer (``chaos.live.grpc_timed``). The pop/FIFO checker finds
no acknowledged send lost, none received after its ack, never two of one message group in
flight and each group in order; the batch checker every batch wholly stored or absent; the
recall checker no recalled message delivered, none early, none unrecalled lost; the TTL checker
none received after its TTL passed, none lost whose TTL had not; the safety and registration
checkers nothing; and PRIORITY messages for a slow consumer, whose lower priorities the leader
parks, none lost (the pop checker). Their canaries (``fifo_group_overlap``, ``grpc_batch_torn``,
``recall_ignored``, ``ttl_ignored``, ``priority_park_lost``: S19's) are caught by the same
checkers in the last test here, so that this file alone proves the bar's lines."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from chaos.live.canaries import CANARIES
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
    # recalls acknowledged (their messages never came: "recall: delivered"), and unrecalled
    # delayed messages received; messages with a short TTL both received and left to expire
    assert g["recalled"] > 10 and g["recalled_after_fault"] > 3 and g["delayed_received"] > 10, g
    assert 0 < g["ttl_short_received"] < g["ttl_short"] and g["ttl_kept"] > 20, g
    assert g["priority_overtaken"] > 0, g  # lower priorities were parked (and none lost)


# The seeded bugs of the gRPC load, four of them in one run: each breaks its own topics only
# (FIFO groups, batches, recalls, TTLs) and each is caught by a checker of its own, whose
# violations no other one makes; the pop checker's loss (priority_park_lost) could come from
# any of them, so that one runs alone. (Each was also shown caught alone, in its own run.)
TOGETHER = (("fifo_group_overlap", "grpc_batch_torn", "recall_ignored", "ttl_ignored"),
            ("priority_park_lost",))


@pytest.mark.parametrize("canaries", TOGETHER, ids="+".join)
def test_the_grpc_canaries_are_caught_by_their_checkers(
        canaries: tuple[str, ...], tmp_path: Path, ran: Callable[[str], None]) -> None:
    canary, *also = canaries
    scenario = CANARIES[canary][0]
    run = run_live(tmp_path, scenario, canary, duration_s=FEATURE_CANARY_DURATION_S, ran=ran,
                   also_canaries=tuple(also))
    assert run["verdict"] == "FAIL", f"canaries {canaries} were not caught by {scenario}"
    for c in canaries:
        fired = [v for v in run["violations"] if v.startswith(CANARY_DETECTORS[c])]
        assert fired, f"{c}: expected {CANARY_DETECTORS[c]}, got {run['violations'][:8]}"


def test_every_grpc_canary_runs() -> None:
    assert sorted(c for group in TOGETHER for c in group) == sorted(GRPC_CANARIES)
