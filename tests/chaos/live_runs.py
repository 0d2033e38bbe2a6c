"""What the live chaos tests share: one run of a scenario on real processes (``run_live``: a
NameServer, a fault proxy and a 3-node broker group, the client library's producers and
consumers, the scenario's faults, a heal, every replica drained and the history checked offline),
its budget (DLEDGER_CHAOS_DURATION_S seconds of faults, default 30; DLEDGER_CHAOS_SEED) and what
each seeded bug must break (``CANARY_DETECTORS``). The full matrix is ``dledger chaos run --all
--canaries`` (docs/chaos/report.md)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaos.live.grpc_load import OVERTAKEN_BY
from chaos.live.runner import RunConfig, run_scenario

DURATION_S = float(os.environ.get("DLEDGER_CHAOS_DURATION_S", "30"))


# S1 isolates, S6 kills, S8 pauses the leader first 7-10 s into the faults; a member of the
# orderly group leaves at 8 s and is back at 10.5 s: 12 s hold one of each.
FEATURE_CANARY_DURATION_S = min(DURATION_S, 12.0)


SEED = int(os.environ.get("DLEDGER_CHAOS_SEED", "1"))


# What each seeded bug must break (the names of the checks that fire, see chaos/live/checkers/safety.py).
CANARY_DETECTORS = {
    "commit_without_quorum": ("lost", "lost_on_replica", "replica_divergences"),
    "async_flush_ack": ("lost", "lost_on_replica"),
    "no_pre_vote_check_quorum": ("leader churn",),
    "skip_checksum": ("replica_divergences", "unexpected", "crash", "lost_on_replica"),
    "delay_early": ("delay: early",),
    "timer_redeliver": ("delay: twice",),
    "lock_unfenced": ("orderly: overlap",),
    "retry_count_lost": ("retry: count", "retry: attempts"),
    "txn_half_visible": ("txn: early", "txn: rolled back", "txn: twice"),
    "txn_forget": ("txn: unresolved", "txn: lost"),
    "cq_keep_tail": ("replica_divergences", "duplicates_protocol", "inconsistent_offsets"),
    "dedup_ignored": ("duplicates_protocol",),
    "dedup_key_only": ("lost",),
    "remoting_ack_early": ("lost",),
    # (raft_traces: two nodes' traces commit different entries at one index, the split brain
    # itself, seen there even when no checked message shows it)
    "membership_forget_on_restart": ("replica_divergences", "lost", "lost_on_replica",
                                     "order_producer", "order_realtime", "split brain",
                                     "raft_traces"),
    "namesrv_skip_signature": ("registrations: accepted",),
    "fifo_group_overlap": ("fifo: overlap",),
    "grpc_batch_torn": ("batch torn",),
    "recall_ignored": ("recall: delivered",),
    "ttl_ignored": ("ttl: expired",),
    "priority_park_lost": ("pop: acknowledged send",),
}


FEATURE_CANARIES = ("delay_early", "timer_redeliver", "lock_unfenced", "retry_count_lost",
                    "txn_half_visible", "txn_forget")
# The canaries run in the short form: the features', the 4.x clients' (S18 kills the leader 5 s
# into the faults: an acknowledgement sent early is lost with it) and the NameServer's (the
# forger sends about two forgeries a second from the start) and the RocketMQ 5 clients' (each
# FIFO group, each batch, each recall and the slow consumer of TTLs show them from the start,
# faults or not)
GRPC_CANARIES = ("fifo_group_overlap", "grpc_batch_torn", "recall_ignored", "ttl_ignored",
                 "priority_park_lost")
SHORT_CANARIES = (*FEATURE_CANARIES, "remoting_ack_early", "namesrv_skip_signature",
                  "dedup_key_only", *GRPC_CANARIES)  # (the shared keys: from the start)
# The Raft and storage canaries are caught by the core checkers on the main workload: their runs
# leave the messaging features out (a feature's finish then waits out its bound on a cluster the
# seeded bug broke, the longest part of such a run)
CORE_CANARIES = ("commit_without_quorum", "async_flush_ack", "no_pre_vote_check_quorum",
                 "skip_checksum", "dedup_key_only", "cq_keep_tail")


def run_live(tmp_path: Path, scenario: str, canary: str | None = None,
             duration_s: float = DURATION_S, quiet_s: float = 3.0, recovery_s: float = 5.0,
             ran: Callable[[str], None] | None = None, seed: int = SEED,
             features: bool | None = None, tls: bool = False,
             also_canaries: tuple[str, ...] = ()) -> dict[str, Any]:
    """One run, its report returned; ``ran`` (the tests' fixture) is told how much it ran."""
    lines: list[str] = []
    cfg = RunConfig(scenario, seed, duration_s, str(tmp_path), canary, quiet_s=quiet_s,
                    recovery_s=recovery_s, features=features, tls=tls, also_canaries=also_canaries)
    run = asyncio.run(run_scenario(cfg, say=lines.append))
    print("\n".join(lines))  # the fault timeline, shown when a run fails
    named = "+".join(c for c in (canary, *also_canaries) if c)
    lines_ran = [f"{scenario}{'/' + named if named else ''}: {duration_s:g} s of faults, "
           f"{run['wall_s']} s wall, {run['check'].get('ok', 0)} acknowledged, {run['verdict']}"]
    feats = run.get("features")
    if feats:  # how much of the features ran
        d, o, r = feats["delay"], feats["orderly"], feats["retry"]
        lines_ran.append(f"  features: delayed {d['acked']} acked / {d['delivered']} delivered; "
                   f"ordered {o['acked']} acked / {o['processed']} processed, {o['rejoins']} "
                   f"rejoins; retried {r['acked']} acked / {r['consumed']} consumed / "
                   f"{r['dead_letters']} dead letters ({r['deliveries']} deliveries); work ended "
                   f"{feats['finished_in_s']} s after the stop")
        t = feats.get("txn") or {}
        lines_ran.append(f"  transactions: {t.get('sent')} sent / {t.get('halves')} halves / "
                   f"{t.get('committed')} committed / {t.get('rolled_back')} rolled back, "
                   f"{t.get('resolved_by_check')} resolved by check-back "
                   f"({t.get('resolved_for_another')} for another producer), "
                   f"{t.get('producer_kills')} producer kills ({t.get('killed_mid_send')} mid-send), "
                   f"redeliveries {t.get('redeliveries')}; none open "
                   f"{t.get('resolved_in_s')} s after the stop (bound {t.get('bound_s')} s), "
                   f"slowest check-back decision {t.get('slowest_check_s')} s after its half")
    reg = run.get("registrations")
    if reg:
        lines_ran.append(f"  forged registrations: {reg['forged']} answered, {reg['refused']} "
                         f"refused; {reg['controls']} signed controls passed; "
                         f"{reg['unanswered']} unanswered; {reg['routed_reads']} route reads")
    if run.get("remoting"):
        lines_ran.append(f"  4.x producers: {run['remoting']['acked']} acknowledged, "
                         f"{run['remoting']['unknown']} unknown")
        o = run["remoting"].get("orderly")
        if o:
            lines_ran.append(f"  4.x orderly: {o['acked']} acknowledged ({o['unknown']} sent "
                             f"again), {o['processed']} listener calls, caught up: "
                             f"{o['caught_up']}")
    g = run.get("grpc")
    if g:
        lines_ran.append(f"  RocketMQ 5 clients: {g['sent']} sends acknowledged "
                         f"({g['send_failures']} unknown), {g['deliveries']} deliveries "
                         f"({g['fifo_deliveries']} FIFO, {g.get('fifo_parallel')} beside another "
                         f"group in flight), {g['acks']} acks; batches {g['batches_acked']} of "
                         f"{g['batches']} acknowledged, {g.get('batches_stored')} stored; "
                         f"caught up: {g['caught_up']}; after the first fault {g.get('sent_after_fault')} "
                         f"sends acknowledged, {g.get('fifo_after_fault')} FIFO deliveries")
        lines_ran.append(f"  delayed {g.get('delayed')} acknowledged, {g.get('recalled')} "
                         f"recalled ({g.get('recalled_after_fault')} after the first fault; "
                         f"{g.get('recalls_refused')} refused, {g.get('recalls_unknown')} "
                         f"unknown), {g.get('delayed_received')} received; TTL "
                         f"{g.get('ttl_short')} short ({g.get('ttl_short_received')} received), "
                         f"{g.get('ttl_kept')} kept; {g.get('priority_overtaken')} PRIORITY "
                         f"messages received after one sent {OVERTAKEN_BY}+ later")
    print("\n".join(lines_ran))
    if ran is not None:  # in the CI log: how much ran
        ran("\n".join(lines_ran))
    return run
