"""Runs simulation seeds: one seed end to end (faults, heal, final checks), and sweeps of many
seeds across worker processes within a wall-clock budget.

Owns the verdict of a seed and how a failure is reported (the replay command, the fault settings
and the last events).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from chaos.sim.node import SimNode, Violation
from chaos.sim.world import FaultSettings, Proposal, World
from dledger.raft.config import Canaries
from dledger.raft.types import Role

CANARIES = {
    "forget_vote": Canaries(forget_vote=True),
    "commit_previous_term": Canaries(commit_previous_term=True),
    "ack_before_fsync": Canaries(ack_before_fsync=True),
    "truncate_on_append": Canaries(truncate_on_append=True),
    "count_self_before_durable": Canaries(count_self_before_durable=True),
    "commit_without_quorum": Canaries(commit_without_quorum=True),
    "ignore_failed_fsync": Canaries(ignore_failed_fsync=True),
    "snapshot_below_commit": Canaries(snapshot_below_commit=True),
    "snapshot_skips_state": Canaries(snapshot_skips_state=True),
    "membership_two_at_once": Canaries(membership_two_at_once=True),
    "membership_count_removed": Canaries(membership_count_removed=True),
    "membership_forget_on_restart": Canaries(membership_forget_on_restart=True),
}

MAIN_TICKS = 400
HEAL_TICKS = 500


@dataclass
class SeedResult:
    seed: int
    nodes: int
    canary: str | None
    ok: bool
    invariant: str = ""
    detail: str = ""
    ticks: int = 0
    events: int = 0
    proposed: int = 0
    acked: int = 0
    elapsed_s: float = 0.0
    faults: FaultSettings | None = None
    fault_counts: dict[str, int] = field(default_factory=dict)
    trail: list[str] = field(default_factory=list)

    def replay_command(self) -> str:
        cmd = f"python -m chaos.sim --seed {self.seed} --nodes {self.nodes}"
        return cmd + (f" --canary {self.canary}" if self.canary else "")

    def report(self) -> str:
        lines = [f"seed {self.seed} ({self.nodes} nodes{', canary ' + self.canary if self.canary else ''}): "
                 f"{'ok' if self.ok else 'VIOLATION ' + self.invariant}",
                 f"  {self.detail}" if self.detail else "",
                 f"  replay: {self.replay_command()}",
                 f"  faults: {self.faults}",
                 f"  fault counts: {self.fault_counts}",
                 f"  ticks {self.ticks}, events {self.events}, proposed {self.proposed}, "
                 f"acked {self.acked}",
                 "  last events:"]
        lines += [f"    {t}" for t in self.trail]
        return "\n".join(line for line in lines if line)


def run_seed(seed: int, nodes: int = 3, canary: str | None = None,
             main_ticks: int = MAIN_TICKS, heal_ticks: int = HEAL_TICKS) -> SeedResult:
    started = time.perf_counter()
    world = World(seed, nodes, CANARIES[canary] if canary else Canaries())
    result = SeedResult(seed, nodes, canary, ok=True, faults=world.faults)
    try:
        for _ in range(main_ticks):
            world.step()
        acked_before_heal = dict(world.acked)
        world.heal()
        _run_heal(world, acked_before_heal, heal_ticks)
    except Violation as v:
        result.ok, result.invariant, result.detail = False, v.invariant, v.detail
    except AssertionError as err:  # an internal assert of the core fired: also a finding
        result.ok, result.invariant, result.detail = False, "CoreAssertion", str(err)
    result.ticks, result.events = world.now, world.events
    result.proposed, result.acked = world.proposed, len(world.acked)
    result.fault_counts = dict(world.fault_counts)
    result.trail = list(world.trail)
    result.elapsed_s = time.perf_counter() - started
    return result


def _run_heal(world: World, acked: dict[bytes, Proposal], heal_ticks: int) -> None:
    for _ in range(heal_ticks):
        world.step()
        if _converged(world, acked):
            _check_acked_everywhere(world, acked)
            return
    leaders = [n.id for n in world.nodes if n.core.role is Role.LEADER]
    raise Violation("HealLiveness", f"no convergence {heal_ticks} ticks after heal "
                                    f"(leaders {leaders}, commits "
                                    f"{[n.core.log.commit_index for n in world.nodes]})")


def _converged(world: World, acked: dict[bytes, Proposal]) -> bool:
    leaders = [n for n in world.nodes if n.core.role is Role.LEADER]
    if len(leaders) != 1:
        return False
    leader = leaders[0].core
    top = max((p.index for p in acked.values()), default=0)
    target = max(top, leader.log.commit_index)
    if leader.config_index > leader.log.commit_index:
        return False  # (a membership change still to commit)
    return all(n.core.log.commit_index >= target and n.applied_index >= target
               for n in members_of(world))


def members_of(world: World) -> list[SimNode]:
    """The nodes of the leader's membership (those outside it need not converge)."""
    leaders = [n for n in world.nodes if n.core.role is Role.LEADER]
    members = leaders[0].core.membership.members if leaders else tuple(world.ids)
    return [n for n in world.nodes if n.id in members]


def _check_acked_everywhere(world: World, acked: dict[bytes, Proposal]) -> None:
    """Every proposal acknowledged before the heal is in every node's committed log."""
    chain = world.observer.committed_chain
    for p in acked.values():
        if world.observer.applied_at.get(p.index) != (p.term, p.value):
            raise Violation("AckedIsCommitted", f"acknowledged {p.value!r} is not the entry "
                                                f"applied at {p.index}")
        for n in members_of(world):
            if p.index < n.store.first_index():  # retained away: check the prefix hash instead
                if p.index >= len(chain) or n.chain_at(p.index) != chain[p.index]:
                    raise Violation("AckedIsCommitted", f"{n.id} retained a different {p.index}")
                continue
            held = n.store.entries(p.index, p.index + 1, 1 << 30)
            if not held or held[0].data != p.value or held[0].term != p.term:
                raise Violation("AckedIsCommitted", f"acknowledged {p.value!r} at ({p.term}, "
                                                    f"{p.index}) is missing on {n.id}")


# -- sweeps ---------------------------------------------------------------------------------------


@dataclass
class SweepSummary:
    planned: int
    ran: int = 0
    failures: list[SeedResult] = field(default_factory=list)
    events: int = 0
    proposed: int = 0
    acked: int = 0
    elapsed_s: float = 0.0
    slowest: SeedResult | None = None
    fault_counts: dict[str, int] = field(default_factory=dict)

    def add(self, r: SeedResult) -> None:
        self.ran += 1
        self.events += r.events
        self.proposed += r.proposed
        self.acked += r.acked
        if not r.ok:
            self.failures.append(r)
        if self.slowest is None or r.elapsed_s > self.slowest.elapsed_s:
            self.slowest = r
        for k, v in r.fault_counts.items():
            self.fault_counts[k] = self.fault_counts.get(k, 0) + v

    def line(self) -> str:
        slow = f", slowest seed {self.slowest.seed} ({self.slowest.elapsed_s:.2f} s)" if self.slowest else ""
        return (f"sim: {self.ran}/{self.planned} seeds ran in {self.elapsed_s:.1f} s, "
                f"{self.events} events, {self.acked}/{self.proposed} proposals acknowledged, "
                f"{len(self.failures)} violation(s){slow}; "
                f"faults {dict(sorted(self.fault_counts.items()))}")


def _job(args: tuple[int, int, str | None]) -> SeedResult:
    seed, nodes, canary = args
    return run_seed(seed, nodes, canary)


def sweep(jobs: Iterable[tuple[int, int, str | None]], budget_s: float, workers: int = 2,
          stop_on_failure: bool = False) -> SweepSummary:
    """Run (seed, nodes, canary) jobs until done or the budget is spent (running seeds finish)."""
    jobs = list(jobs)
    summary = SweepSummary(planned=len(jobs))
    started = time.perf_counter()
    for r in _results(jobs, workers, started + budget_s):
        summary.add(r)
        if stop_on_failure and not r.ok:
            break
    summary.elapsed_s = time.perf_counter() - started
    return summary


def _results(jobs: list[tuple[int, int, str | None]], workers: int,
             deadline: float) -> Iterator[SeedResult]:
    if workers <= 1:
        for j in jobs:
            if time.perf_counter() > deadline:
                return
            yield _job(j)
        return
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers) as pool:
        pending = iter(jobs)
        running = []
        for j in pending:
            running.append(pool.apply_async(_job, (j,)))
            if len(running) >= workers * 2:
                break
        while running:
            res = running.pop(0).get(timeout=max(60.0, deadline - time.perf_counter() + 60.0))
            yield res
            if time.perf_counter() < deadline:
                nxt = next(pending, None)
                if nxt is not None:
                    running.append(pool.apply_async(_job, (nxt,)))
