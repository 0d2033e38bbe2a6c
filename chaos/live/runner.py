"""Runs one live chaos scenario end to end (docs/testing.md) and returns its result record:

start the cluster (every link through a proxy) -> create the topic -> start producers and
consumers (and, where the scenario has them, the messaging features: ``chaos.live.features.driver``)
-> quiet period -> the scenario's fault schedule -> heal everything -> wait for a leader -> let
the workload run on (recovery) -> stop producers -> let the features finish and read them back
-> wait until every replica has applied what the group committed -> stop consumers -> drain
every queue from each replica and through the leader -> stop the cluster -> check the history,
the dumps and the node traces offline (and the features' records, by their checkers).

A harness failure (the cluster would not start, a replica never caught up) is reported as such,
apart from safety violations. Every wait has a deadline; every process started is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.config import REMOTING_CANARIES
from broker.core.cq_files import QUEUE_CANARIES
from broker.core.sendwire import SCOPE_CANARIES
from broker.core.state import DEDUP_CANARIES
from chaos import traces
from chaos.live.canaries import CANARIES
from chaos.live.checkers.registrations import check_registrations
from chaos.live.checkers.safety import check_run
from chaos.live.cluster import ChaosCluster
from chaos.live.features.clients import SEND_ERRORS
from chaos.live.features.driver import BROKER_CANARIES as FEATURE_CANARIES
from chaos.live.features.driver import Features, broker_args, log_to
from chaos.live.forger import Forger
from chaos.live.grpc_load import GRPC_LOAD_CANARIES, GrpcLoad, start_grpc_load
from chaos.live.nemesis import SCENARIOS, Ctl, Scenario, find_leader
from chaos.live.remoting import ORDERLY_TOPIC, RemotingProducers
from chaos.live.run_record import corrupt_led, fault_windows, series
from chaos.live.workload import QUEUES, TOPIC, History, consumer, drain, producer
from chaos.toxiproxy.errors import ToxiproxyError
from client.cluster.routes import CANARIES as CLIENT_CANARIES
from dledger.client import LogClient
from dledger.localcluster import ClusterError
from dledger.raft.config import Canaries
from namesrv.registration_auth import NAMESRV_CANARIES
from protocol import broker_kinds as bp
from protocol.errors import DLedgerError
from protocol.tls import client_context

LEADER_WAIT_S = 30.0
CATCH_UP_WAIT_S = 30.0
# The catch-up wait also ends once the laggard has not moved for this long (the lowest applied
# index among the nodes, and which nodes answer): a replica that stands still that long after
# the heal and the recovery is stuck, while a leader may go on applying its periodic entries
# alone (a seeded bug's runs had waited out the whole bound for nothing)
CATCH_UP_STALL_S = 10.0


class HarnessError(RuntimeError):
    """The run could not be carried out (not a verdict on the system under test)."""


@dataclass(frozen=True)
class RunConfig:
    scenario: str
    seed: int = 0
    duration_s: float = 120.0  # the fault phase
    work_dir: str = "chaos-work"
    canary: str | None = None
    quiet_s: float = 5.0  # before the first fault
    recovery_s: float = 10.0  # workload kept running after the final heal
    tick_ms: int = 100
    election_ticks: int = 10
    keep_data: bool = False
    features: bool | None = None  # the messaging features beside the workload (None: the
    # scenario's choice)
    tls: bool = False  # TLS on every listener, mutual TLS on peer links (ChaosCluster.tls)
    # more seeded bugs of the gRPC load beside ``canary`` (each on its own topics, each caught
    # by a checker of its own: one run proves several; the CI's gRPC canaries)
    also_canaries: tuple[str, ...] = ()


def _broker_args(sc: Scenario, canary: str | None,
                 also: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The brokers' extra options: the features' (with a broker canary), the remoting
    endpoint's canary, the gRPC load's canaries."""
    args = broker_args(canary) if sc.features else ()
    if canary in DEDUP_CANARIES | SCOPE_CANARIES | QUEUE_CANARIES:  # (the core's: with or
        args += ("--broker-canary", canary)  # without the features)
    if sc.remoting and canary in REMOTING_CANARIES:  # (the listeners: ChaosCluster.remoting)
        args += ("--broker-canary", canary)
    if sc.grpc:  # (the gRPC listeners: ChaosCluster.grpc)
        for c in (canary, *also):
            if c in GRPC_LOAD_CANARIES:
                args += ("--broker-canary", c)
    return args


def scenario_for(cfg: RunConfig) -> Scenario:
    sc = SCENARIOS[cfg.scenario]
    if cfg.canary is not None:
        target, overrides = CANARIES[cfg.canary]
        if target != cfg.scenario:
            raise ValueError(f"canary {cfg.canary} belongs to scenario {target}")
        sc = dataclasses.replace(sc, **overrides)
    if cfg.features is not None:
        sc = dataclasses.replace(sc, features=cfg.features)
    for c in cfg.also_canaries:
        if c not in GRPC_LOAD_CANARIES or CANARIES[c][0] != cfg.scenario or c == cfg.canary:
            raise ValueError(f"canary {c} cannot ride along in a run of {cfg.scenario}")
    if sc.grpc and cfg.tls:
        raise ValueError(f"scenario {sc.name} (RocketMQ 5 clients over gRPC) runs without TLS")
    if cfg.canary in FEATURE_CANARIES and not sc.features:
        raise ValueError(f"canary {cfg.canary} is caught by the features' checkers: it needs "
                         f"the features on")
    return sc


async def _node_statuses(control: LogClient, nodes: list[str]) -> dict[str, dict[str, Any]]:
    out = {}
    for n in nodes:
        try:
            out[n] = await control.call(n, bp.BROKER_STATUS, timeout_s=1.0)
        except DLedgerError:
            continue
    return out


async def _wait(cond: Callable[[], Any], timeout_s: float, what: str,
                progress: Callable[[], object] | None = None, stall_s: float = 0.0) -> float:
    """Poll ``cond`` (a coroutine function) until it returns truthy; returns the seconds taken.
    With ``progress`` (what ``cond`` last saw), the wait also ends, as one that ran out, once
    that has not changed for ``stall_s``."""
    start = moved = time.monotonic()
    mark: object = None
    while (now := time.monotonic()) - start < timeout_s:
        if await cond():
            return time.monotonic() - start
        if progress is not None:
            if (seen := progress()) != mark:
                mark, moved = seen, now
            elif now - moved >= stall_s:
                raise HarnessError(f"no progress for {stall_s:g} s (after {now - start:.1f} "
                                   f"s) waiting for {what}")
        await asyncio.sleep(0.1)  # polling interval of a bounded wait
    raise HarnessError(f"timed out after {timeout_s} s waiting for {what}")


async def _final_heal(ctl: Ctl, problems: list[str]) -> None:
    """Undo every fault. A node found dead here died on its own (every schedule restarts the
    nodes it stops): that is reported, with the end of its log."""
    c = ctl.cluster
    for n in c.active_ids():  # (a node removed from the group was stopped on purpose)
        proc = c.brokers.servers[n].proc
        if proc is not None and proc.poll() is not None:
            tail = c.brokers.log_tail(n, 3).strip().splitlines()
            problems.append(f"crash: {n} exited with {proc.returncode} on its own: "
                            f"{tail[-1][:200] if tail else ''}")
    for n in c.node_ids:
        if c.running(n):
            await ctl.do(c.resume, n)
    await ctl.do(c.heal)
    await ctl.do(c.unslow)
    if not c.namesrv_running:
        await ctl.do(c.start_namesrv)
    for n in c.active_ids():
        if not c.running(n):
            await ctl.restart(n)


async def run_scenario(cfg: RunConfig, say: Callable[[str], None] = print) -> dict[str, Any]:
    sc = scenario_for(cfg)
    rng = random.Random(cfg.seed)
    label = f"{sc.name}-seed{cfg.seed}" + (f"-{cfg.canary}" if cfg.canary else "")
    base = os.path.abspath(os.path.join(cfg.work_dir, label))
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    core_canaries = (cfg.canary,) if cfg.canary in Canaries.__dataclass_fields__ else ()
    client_canaries = (cfg.canary,) if cfg.canary in CLIENT_CANARIES else ()
    cluster = ChaosCluster(base, size=sc.nodes, flush_mode=sc.flush_mode, tick_ms=cfg.tick_ms,
                           election_ticks=cfg.election_ticks, canaries=core_canaries,
                           async_flush_ms=sc.async_flush_ms, seed=cfg.seed, spares=sc.spares,
                           broker_args=_broker_args(sc, cfg.canary, cfg.also_canaries),
                           namesrv_args=(("--canary", cfg.canary) if cfg.canary in NAMESRV_CANARIES
                                         else ()),
                           tls=cfg.tls, grpc=sc.grpc, remoting=sc.remoting > 0)
    wall0 = time.monotonic()
    t0 = time.time()
    say(f"[{label}] starting {sc.nodes} brokers, a NameServer and "
        f"{sc.nodes * (sc.nodes - 1) + 2 * sc.nodes} proxies ({sc.flush_mode} flush"
        f"{', TLS (mutual on peer links)' if cfg.tls else ''}"
        f"{', with the messaging features' if sc.features else ''})")
    history = History(os.path.join(base, "history.jsonl"))
    notes: list[str] = []
    problems: list[str] = []
    replicas: dict[str, dict[int, list[tuple[int, str]]]] = {}
    leader_drain: dict[int, list[tuple[int, str]]] = {}
    message_ids: dict[tuple[int, int], str] = {}  # the leader's messages' ids, by (queue, offset)
    ctl: Ctl | None = None
    feats: Features | None = None
    workers: list[asyncio.Task[None]] = []
    readers: list[asyncio.Task[None]] = []
    remoting: RemotingProducers | None = None
    grpc_load: GrpcLoad | None = None
    forger: Forger | None = None
    stop_producers, stop_consumers = asyncio.Event(), asyncio.Event()
    client_log = contextlib.ExitStack()
    client_log.enter_context(log_to(os.path.join(base, "clients.log")))

    def phase(text: str) -> None:  # (where a run's wall time goes, beside the faults')
        say(f"[{label}] {time.time() - t0:6.1f} s  {text}")

    try:
        await asyncio.to_thread(cluster.start)
        phase("processes started")
        nodes = cluster.node_ids
        async with LogClient(cluster.direct_client_addresses, timeout_s=3.0,
                             ssl_context=client_context(cluster.tls_ca) if cluster.tls_ca
                             else None) as control:
            await _wait(lambda: find_leader(control, nodes), LEADER_WAIT_S, "a first leader")
            await control.call_leader(bp.TOPIC_PUT, TOPIC, QUEUES, QUEUES, 6, timeout_s=10.0)
            workers = [asyncio.create_task(producer(history, cluster.namesrv, k, stop_producers,
                                                    sc.pause_s, random.Random(rng.random()),
                                                    canaries=client_canaries,
                                                    shared_keys=sc.producers > 1))
                       for k in range(sc.producers)]
            readers = [asyncio.create_task(consumer(
                history, cluster.namesrv, f"c{q}{kind}", q, cluster.group, stop_consumers,
                None if kind == "t" else 10.0, random.Random(rng.random())))
                for q in range(QUEUES) for kind in ("t", "r")]
            if sc.remoting:
                if sc.remoting_orderly:
                    await control.call_leader(bp.TOPIC_PUT, ORDERLY_TOPIC, QUEUES, QUEUES, 6,
                                              timeout_s=10.0)
                remoting = RemotingProducers(history, cluster.namesrv, TOPIC, sc.remoting,
                                             sc.pause_s, rng.randrange(1 << 30),
                                             os.path.join(base, "remoting-home"),
                                             orderly=sc.remoting_orderly)
                try:
                    await remoting.start()
                except (RuntimeError, OSError, TimeoutError) as err:
                    raise HarnessError(f"the 4.x producers did not start: {err!r}") from err
            if sc.grpc:
                try:
                    grpc_load = await start_grpc_load(control, cluster.namesrv,
                                                      cluster.grpc_addresses, base, cfg.seed)
                except SEND_ERRORS as err:
                    raise HarnessError(f"the RocketMQ 5 clients did not start: {err!r}") from err
            if sc.features:
                feats = Features(cluster.namesrv, control, nodes, random.Random(rng.random()),
                                 stop_producers, work_dir=base)
                try:
                    await feats.start()
                except SEND_ERRORS as err:
                    raise HarnessError(f"the messaging features did not start: {err!r}") from err
            with open(cluster.key_file, encoding="utf-8") as f:  # (the negative controls')
                # (its own stream: drawing from the run's RNG would move every seeded
                # schedule that comes after, and the canaries' seeds were chosen on those)
                forger = Forger(cluster.namesrv, cluster.group, f.read().strip().encode(),
                                random.Random(f"forger-{cfg.seed}"), stop_producers,
                                client_context(cluster.tls_ca) if cluster.tls_ca else None)
            workers.append(asyncio.create_task(forger.run()))
            phase("the workload started")
            await asyncio.sleep(cfg.quiet_s)  # the quiet period before the first fault
            ctl = Ctl(cluster, history, rng, time.monotonic() + cfg.duration_s, control=control,
                      say=phase)
            await sc.schedule(ctl)
            phase("heal everything")
            await _final_heal(ctl, problems)
            history.add(proc="nemesis", type="info", f="heal")
            nodes = await _final_members(control, cluster, notes)
            await _after_heal(cfg, control, nodes, stop_producers, workers, notes, problems,
                              feats, os.path.join(base, "features.jsonl"), remoting, grpc_load,
                              phase)
            await asyncio.sleep(1.0)  # consumers' last long polls see the end of each queue
            stop_consumers.set()
            await asyncio.gather(*readers)
            phase("the consumers stopped")
            replicas, leader_drain, drained = await drain(control, nodes, message_ids)
            problems += drained
            phase("every replica drained")
    except (HarnessError, ClusterError, ToxiproxyError) as err:
        problems.append(f"harness: {err}")
        notes.append("the run did not complete; the checks below cover what was recorded")
    finally:
        stop_producers.set()
        stop_consumers.set()
        for task in workers + readers:
            task.cancel()
        await asyncio.gather(*workers, *readers, return_exceptions=True)
        if remoting is not None:
            await remoting.stop()
        if grpc_load is not None:
            await grpc_load.stop()
        if feats is not None:
            await feats.close()
        client_log.close()
        history.close()
        await asyncio.to_thread(cluster.stop)
        phase("the processes stopped")
    trace_events = traces.load(cluster.trace_paths())
    bound = None
    if sc.churn_bound:
        windows = sum(1 for e in history.events if e.get("f") == "start" and e.get("proc") == "nemesis")
        # With Pre-Vote and CheckQuorum a cut link between the leader and one follower changes
        # no leader at all (the full matrix: 0 changes in 60 s). Without them, every window
        # forces at least one election (the stranded follower's higher term deposes the
        # leader through the third node), so the bound must stay below the window count:
        # one incidental election per two windows is tolerated, and at least one per run.
        bound = max(1, windows // 2)
    result = check_run(history.events, replicas, leader_drain, trace_events,
                       max_leader_changes=bound, silence=sc.silence, message_ids=message_ids,
                       resending=frozenset(remoting.procs_resending()) if remoting else frozenset())
    forged = check_registrations(forger.attempts, forger.routed) if forger else None
    violations = list(result.violations) + problems + (feats.violations if feats else []) \
        + (remoting.orderly_violations() if remoting is not None and sc.remoting_orderly else []) \
        + (forged.lines() if forged is not None else []) \
        + (grpc_load.violations() if grpc_load is not None else [])
    verdict = "FAIL" if violations else "PASS"
    durability = dict(ctl.durability) if ctl else {}
    corrupted = durability.pop("corrupted", [])
    if corrupted:
        durability["corrupt_node_became_leader"] = corrupt_led(corrupted, trace_events)
    run: dict[str, Any] = {
        "scenario": sc.name, "title": sc.title, "seed": cfg.seed, "nodes": sc.nodes,
        "flush_mode": sc.flush_mode, "canary": cfg.canary, "duration_s": cfg.duration_s,
        "wall_s": round(time.monotonic() - wall0, 1), "faults": dict(ctl.faults) if ctl else {},
        "fault_windows": fault_windows(history.events, t0), "durability": durability,
        "check": result.to_dict(), "series": series(history.events, trace_events, t0),
        "verdict": verdict, "violations": violations,
        "expect": "fail" if cfg.canary else "pass", "notes": notes,
    }
    if feats is not None:
        run["features"] = feats.result
    if forged is not None:
        run["registrations"] = forged.summary()
    if sc.remoting:  # how much the 4.x producers did (their procs are r0, r1 ...)
        outcomes = [e["type"] for e in history.events if e.get("f") == "send"
                    and str(e.get("proc", "")).startswith("r") and e["type"] != "invoke"]
        run["remoting"] = {"acked": outcomes.count("ok"), "unknown": outcomes.count("info")}
        if remoting is not None and sc.remoting_orderly:
            run["remoting"]["orderly"] = {
                "acked": sum(remoting.acked.values()), "unknown": remoting.orderly_unknown,
                "processed": len(remoting.processing), "caught_up": remoting.orderly_drained}
    if grpc_load is not None:  # how much the RocketMQ 5 clients did
        run["grpc"] = grpc_load.summary(next((e["t"] for e in history.events if e.get("proc")
                                              == "nemesis" and e.get("f") == "start"), None))
    if sc.flush_mode == "async":
        run["notes"].append("async flush: acknowledged from the page cache; what a power loss "
                            "takes is measured here")
    say(f"[{label}] {verdict}: {result.to_dict().get('ok', 0)} acknowledged, "
        f"{len(violations)} violation(s) in {run['wall_s']} s")
    for v in violations[:10]:
        say(f"[{label}]   {v}")
    # (a harness or liveness problem keeps the data, even in a canary run that failed as it must)
    if not cfg.keep_data and not problems and verdict == ("FAIL" if cfg.canary else "PASS"):
        shutil.rmtree(os.path.join(base, "brokers"), ignore_errors=True)
    return run


async def _final_members(control: LogClient, cluster: ChaosCluster, notes: list[str]) -> list[str]:
    """The nodes to wait for and drain: the group's members (a scenario that changed them: the
    leader's membership, once a leader answers; the nodes it removed are stopped)."""
    if not cluster.spares:
        return cluster.node_ids
    try:
        await _wait(lambda: find_leader(control, cluster.active_ids()), LEADER_WAIT_S,
                    "a leader after the heal")
        leader = await find_leader(control, cluster.active_ids())
        st = await control.call(leader, bp.BROKER_STATUS, timeout_s=2.0) if leader else None
    except (HarnessError, DLedgerError):
        st = None
    if st is None:
        return cluster.active_ids()
    m = st["membership"]
    members = sorted(set(m["voters"]) | set(m["learners"]))
    notes.append(f"the group ended with voters {', '.join(m['voters'])}"
                 + (f" and learners {', '.join(m['learners'])}" if m["learners"] else ""))
    for n in members:  # (a member the schedule did not know of: started, to be drained)
        if not cluster.running(n):
            await asyncio.to_thread(cluster.restart, n)
    cluster.members = set(members)
    return members


async def _after_heal(cfg: RunConfig, control: LogClient, nodes: list[str],
                      stop_producers: asyncio.Event, workers: list[asyncio.Task[None]],
                      notes: list[str], problems: list[str], feats: Features | None,
                      features_path: str, remoting: RemotingProducers | None = None,
                      grpc_load: GrpcLoad | None = None,
                      phase: Callable[[str], None] = lambda _text: None) -> None:
    """Wait for a leader, let the workload run on, stop the producers, let the features finish,
    wait until every replica has applied the whole log. A wait that runs out is a problem to
    report, and the run goes on to drain what the replicas hold (a seeded bug may have left a
    node that cannot catch up)."""
    try:
        took = await _wait(lambda: find_leader(control, nodes), LEADER_WAIT_S,
                           "a leader after the heal")
        notes.append(f"a leader answered {took:.1f} s after the heal")
    except HarnessError as err:
        problems.append(f"liveness: {err}")
    await asyncio.sleep(cfg.recovery_s)  # the workload runs on: recovery is measured
    stop_producers.set()
    await asyncio.gather(*workers)
    phase("the producers stopped")
    if remoting is not None:
        await remoting.stop()  # (their last sends are recorded before the drain)
        phase("the 4.x producers stopped")
    if grpc_load is not None:  # (its consumers catch up, its batch topic is read back)
        await grpc_load.finish()
        phase("the RocketMQ 5 clients finished")
    if feats is not None:
        await feats.finish(features_path)
        phase("the features finished")
        ended = feats.result.get("finished_in_s")
        notes.append(f"the features' work ended {ended} s after the producers stopped"
                     if ended is not None else "the features' work had not ended when the wait "
                     "ran out")

    seen: list[object] = [None]

    async def caught_up() -> bool:
        st = await _node_statuses(control, nodes)
        seen[0] = (sorted(st), min((s["applied_index"] for s in st.values()), default=0))
        if len(st) < len(nodes):
            return False
        commits = {s["raft"]["commit_index"] for s in st.values()}
        lasts = {s["raft"]["last_index"] for s in st.values()}
        return (len(commits) == 1 and lasts == commits
                and all(s["applied_index"] >= s["raft"]["commit_index"] for s in st.values()))

    try:
        await _wait(caught_up, CATCH_UP_WAIT_S, "every replica to apply the whole log",
                    progress=lambda: seen[0], stall_s=CATCH_UP_STALL_S)
        phase("every replica caught up")
    except HarnessError as err:
        problems.append(f"liveness: {err}")
