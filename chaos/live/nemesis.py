"""The fault schedules of docs/testing.md (S0-S21; S16: issue 16's silent leader), each a
coroutine driven by one seeded RNG.

A schedule runs until its deadline, records every fault it starts and stops in the history
(``proc: nemesis``), and leaves cleaning up to the runner's final heal. It decides *when* by the
wall clock: that is the schedule itself, not a wait for a condition. Cluster calls block, so they
run in a worker thread (``Ctl.do``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from chaos.live.cluster import ChaosCluster
from chaos.live.lost_answers import s21_lost_answers
from chaos.live.membership import s17_membership
from chaos.live.silence import FAULT as SILENCE_FAULT
from chaos.live.silence import SilenceBound
from chaos.live.workload import History
from dledger.client import LogClient
from dledger.localcluster import ClusterError
from protocol import broker_kinds as bp
from protocol.errors import DLedgerError


@dataclass
class Ctl:
    """What a schedule may touch: the cluster, the history, the RNG, the run's durability log."""

    cluster: ChaosCluster
    history: History
    rng: random.Random
    deadline: float  # time.monotonic() at which the schedule must stop starting faults
    durability: dict[str, Any] = field(default_factory=lambda: {
        "power_loss_events": 0, "bytes_discarded": 0, "corruption_events": 0,
        "corruptions_detected": 0, "corrupt_node_became_leader": False, "corrupted": []})
    faults: dict[str, int] = field(default_factory=dict)
    control: LogClient | None = None
    say: Callable[[str], None] = lambda text: None  # the progress display

    async def do(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    def start(self, fault: str, nodes: list[str], **extra: Any) -> None:
        self.faults[fault] = self.faults.get(fault, 0) + 1
        self.say(f"{fault} {' '.join(nodes)}".strip())
        self.history.add(proc="nemesis", type="info", f="start", fault=fault, nodes=sorted(nodes),
                         **extra)

    def stop(self, fault: str, nodes: list[str]) -> None:
        self.history.add(proc="nemesis", type="info", f="stop", fault=fault, nodes=sorted(nodes))

    def left(self) -> float:
        return self.deadline - time.monotonic()

    async def sleep(self, seconds: float) -> bool:
        """Sleep (the schedule's own timing), capped by the deadline; False once it is past."""
        await asyncio.sleep(max(0.0, min(seconds, self.left())))
        return self.left() > 0

    async def leader(self) -> str | None:
        assert self.control is not None
        return await find_leader(self.control, [n for n in self.cluster.node_ids
                                                if self.cluster.running(n)])

    async def restart(self, nid: str) -> None:
        """Start a stopped node again; a node that refuses its damaged disk is repaired (its log
        wiped, its term and vote kept) and started again, and the detection is counted."""
        try:
            await self.do(self.cluster.restart, nid)
        except ClusterError as err:
            if "orrupt" not in str(err):
                raise
            self.durability["corruptions_detected"] += 1
            self.history.add(proc="nemesis", type="info", f="detected", fault="corrupt",
                             nodes=[nid], error=str(err).splitlines()[-1][:200])
            await self.do(self.cluster.wipe_log, nid)
            await self.do(self.cluster.restart, nid)


async def find_leader(control: LogClient, nodes: list[str]) -> str | None:
    """The node that says it leads at the highest term, asked directly (out of band)."""
    best: tuple[int, str] | None = None
    for nid in nodes:
        try:
            st = await control.call(nid, bp.BROKER_STATUS, timeout_s=1.0)
        except DLedgerError:
            continue
        raft = st["raft"]
        if raft["role"] == "leader" and (best is None or raft["term"] > best[0]):
            best = (int(raft["term"]), nid)
    return best[1] if best else None



Schedule = Callable[[Ctl], Awaitable[None]]


async def s0_baseline(c: Ctl) -> None:
    await c.sleep(c.left())


async def s1_leader_isolation(c: Ctl) -> None:
    while await c.sleep(7):
        leader = await c.leader()
        if leader is None:
            continue
        links = await c.do(c.cluster.isolate, [leader])
        c.start("isolate", [leader])
        await c.sleep(8)
        await c.do(c.cluster.heal, links)
        c.stop("isolate", [leader])


async def s2_majority_minority(c: Ctl) -> None:
    while await c.sleep(c.rng.uniform(2, 6)):
        nodes = list(c.cluster.node_ids)
        c.rng.shuffle(nodes)
        minority = nodes[: (len(nodes) - 1) // 2]
        links = await c.do(c.cluster.partition, [minority])
        c.start("partition", minority)
        await c.sleep(c.rng.uniform(6, 10))
        await c.do(c.cluster.heal, links)
        c.stop("partition", minority)


S3_MIN_WINDOW_S = 8.0


async def s3_partial_partition(c: Ctl) -> None:
    """Cut the link between the leader and one follower (both directions), everyone else
    connected: the stranded follower must not unseat a leader the majority still hears.
    The follower rotates each cycle. A window starts only while at least ``S3_MIN_WINDOW_S``
    of the run is left, so that every window is long enough for a stranded follower's election
    timeout to fire several times (the churn bound counts windows, see the runner)."""
    k = 0
    while await c.sleep(3) and c.left() >= S3_MIN_WINDOW_S:
        leader = await c.leader()
        if leader is None:
            continue
        followers = [n for n in c.cluster.node_ids if n != leader]
        other = followers[(k + c.rng.randrange(len(followers))) % len(followers)]
        k += 1
        links = [(leader, other), (other, leader)]
        await c.do(c.cluster.cut, links)
        c.start("cut-link", [leader, other])
        await c.sleep(15)
        await c.do(c.cluster.heal, links)
        c.stop("cut-link", [leader, other])


async def s4_bridge(c: Ctl) -> None:
    """Two halves that only one node (the bridge) joins: 5 nodes."""
    while await c.sleep(10):
        nodes = list(c.cluster.node_ids)
        c.rng.shuffle(nodes)
        half = len(nodes) // 2
        left, right = nodes[:half], nodes[half + 1:]
        links = [(a, b) for a in left for b in right] + [(b, a) for a in left for b in right]
        await c.do(c.cluster.cut, links)
        c.start("bridge", sorted(nodes), bridge=nodes[half])
        await c.sleep(15)
        await c.do(c.cluster.heal, links)
        c.stop("bridge", sorted(nodes))


async def s5_majorities_ring(c: Ctl) -> None:
    """Each node sees only its two ring neighbours: every node sees a majority, no two the same."""
    while await c.sleep(10):
        nodes = list(c.cluster.node_ids)
        c.rng.shuffle(nodes)
        n = len(nodes)
        near = {(nodes[i], nodes[(i + d) % n]) for i in range(n) for d in (-1, 1)}
        links = [link for link in c.cluster.peer_links() if link not in near]
        await c.do(c.cluster.cut, links)
        c.start("ring", sorted(nodes))
        await c.sleep(15)
        await c.do(c.cluster.heal, links)
        c.stop("ring", sorted(nodes))


async def s6_kill_leader(c: Ctl) -> None:
    while await c.sleep(10):
        leader = await c.leader()
        if leader is None:
            continue
        await c.do(c.cluster.kill, leader)
        c.start("kill", [leader])
        await c.sleep(c.rng.uniform(0, 5))
        await c.restart(leader)
        c.stop("kill", [leader])


async def s18_kill_or_isolate(c: Ctl) -> None:
    """The leader killed (restarted 0-3 s later) and isolated (healed 5 s later) in turn."""
    kill = True
    while await c.sleep(5):
        leader = await c.leader()
        if leader is None:
            continue
        if kill:
            await c.do(c.cluster.kill, leader)
            c.start("kill", [leader])
            await c.sleep(c.rng.uniform(0, 3))
            await c.restart(leader)
            c.stop("kill", [leader])
        else:
            links = await c.do(c.cluster.isolate, [leader])
            c.start("isolate", [leader])
            await c.sleep(5)
            await c.do(c.cluster.heal, links)
            c.stop("isolate", [leader])
        kill = not kill


async def s7_kill_random_or_all(c: Ctl) -> None:
    while await c.sleep(10):
        nodes = list(c.cluster.node_ids) if c.rng.random() < 0.3 else [c.rng.choice(c.cluster.node_ids)]
        for n in nodes:
            await c.do(c.cluster.kill, n)
        c.start("kill-all" if len(nodes) > 1 else "kill", nodes)
        await c.sleep(c.rng.uniform(0, 3))
        for n in nodes:
            await c.restart(n)
        c.stop("kill-all" if len(nodes) > 1 else "kill", nodes)


async def s8_zombie_leader(c: Ctl) -> None:
    """SIGSTOP the leader for 2-8 election timeouts' worth, then SIGCONT: the zombie wakes up."""
    election_s = c.cluster.tick_ms * c.cluster.election_ticks / 1000
    while await c.sleep(8):
        leader = await c.leader()
        if leader is None:
            continue
        await c.do(c.cluster.pause, leader)
        c.start("pause", [leader])
        await c.sleep(c.rng.uniform(2 * election_s, 8 * election_s))
        await c.do(c.cluster.resume, leader)
        c.stop("pause", [leader])


async def s9_latency(c: Ctl) -> None:
    """50 +- 50 ms on every peer link; now and then 400 +- 300 ms on the leader's outbound links."""
    peers = c.cluster.peer_links()
    await c.do(c.cluster.slow, peers, 50, 50)
    c.start("latency", [], latency_ms=50, jitter_ms=50)
    while await c.sleep(10):
        leader = await c.leader()
        if leader is None:
            continue
        out = [(a, b) for a, b in peers if a == leader]
        await c.do(c.cluster.slow, out, 400, 300)
        c.start("slow-leader", [leader], latency_ms=400, jitter_ms=300)
        await c.sleep(10)
        await c.do(c.cluster.slow, out, 50, 50)
        c.stop("slow-leader", [leader])


async def s10_loss(c: Ctl) -> None:
    """Loss, emulated in proxy mode: for 10 s, each of one node's links flaps (blackholed in
    each 0.5 s slot with probability p = 10-30 %; every lifted cut resets its connections)."""
    while await c.sleep(5):
        node = c.rng.choice(c.cluster.node_ids)
        links = [(a, b) for a, b in c.cluster.peer_links() if node in (a, b)]
        p = c.rng.uniform(0.1, 0.3)
        c.start("loss", [node], p=round(p, 2))
        end = time.monotonic() + 10
        while time.monotonic() < end and c.left() > 0:
            cut = [link for link in links if c.rng.random() < p]
            await c.do(c.cluster.heal, [link for link in links if link not in cut])
            await c.do(c.cluster.cut, cut)
            await c.sleep(0.5)
        await c.do(c.cluster.heal, links)
        c.stop("loss", [node])


async def _power_loss(c: Ctl, nodes: list[str]) -> None:
    discarded = await asyncio.gather(*(c.do(c.cluster.power_loss, n) for n in nodes))
    c.durability["power_loss_events"] += len(nodes)
    c.durability["bytes_discarded"] += sum(max(0, d) for d in discarded)


async def s11_power_loss_minority(c: Ctl) -> None:
    while await c.sleep(10):
        node = c.rng.choice(c.cluster.node_ids)
        await _power_loss(c, [node])
        c.start("power-loss", [node])
        await c.sleep(c.rng.uniform(1, 3))
        await c.restart(node)
        c.stop("power-loss", [node])


async def s12_power_loss_all(c: Ctl) -> None:
    while await c.sleep(10):
        nodes = list(c.cluster.node_ids)
        await _power_loss(c, nodes)
        c.start("power-loss-all", nodes)
        await c.sleep(c.rng.uniform(1, 3))
        await asyncio.gather(*(c.restart(n) for n in nodes))
        c.stop("power-loss-all", nodes)


def s13_corruption(kinds: tuple[str, ...] = ("bitflip", "truncate")) -> Schedule:
    async def run(c: Ctl) -> None:
        """Stop a follower, damage its newest segment, start it again (a node that refuses
        its damaged log is repaired by wiping the log: counted as detected)."""
        while await c.sleep(10):
            leader = await c.leader()
            followers = [n for n in c.cluster.node_ids if n != leader]
            if leader is None or not followers:
                continue
            node = c.rng.choice(followers)
            await c.do(c.cluster.stop_node, node)
            what = await c.do(c.cluster.corrupt, node, c.rng, c.rng.choice(kinds))
            c.durability["corruption_events"] += 1
            c.durability["corrupted"].append({**what, "t": time.time()})
            c.start("corrupt", [node], **{k: v for k, v in what.items() if k != "node"})
            await c.restart(node)
            await c.sleep(5)
            c.stop("corrupt", [node])
    return run


async def s14_namesrv_and_leader(c: Ctl) -> None:
    """The NameServer goes down and the leader is killed in the same window; clients must follow
    the brokers' own redirects."""
    while await c.sleep(8):
        await c.do(c.cluster.kill_namesrv)
        c.start("namesrv-down", [])
        leader = await c.leader()
        if leader is not None:
            await c.do(c.cluster.kill, leader)
            c.start("kill", [leader])
            await c.sleep(c.rng.uniform(0, 3))
            await c.restart(leader)
            c.stop("kill", [leader])
        await c.sleep(7)
        await c.do(c.cluster.start_namesrv)
        c.stop("namesrv-down", [])


async def s15_transfer_storm(c: Ctl) -> None:
    assert c.control is not None
    while await c.sleep(8):
        leader = await c.leader()
        if leader is None:
            continue
        to = c.rng.choice([n for n in c.cluster.node_ids if n != leader])
        c.start("transfer", [leader], to=to)
        try:
            await c.control.call(leader, bp.TRANSFER_LEADERSHIP, to, timeout_s=5.0)
        except DLedgerError as err:
            c.history.add(proc="nemesis", type="info", f="transfer-failed", error=str(err)[:200])
        c.stop("transfer", [leader])


SILENCE_S = 15.0


async def s16_leader_silence(c: Ctl) -> None:
    """One-way silence of the leader for 15 s: everything it sends (to its peers, the NameServer,
    its answers to clients) is swallowed while it hears everything. The group elects another
    leader; the clients must find it at once and keep their pace (``chaos.live.silence``). A
    window, once started, lasts its 15 s even past the deadline: the bound is about the whole
    window."""
    while await c.sleep(1):
        leader = await c.leader()
        if leader is None:
            continue
        links = await c.do(c.cluster.silence, leader)
        c.start(SILENCE_FAULT, [leader])
        await asyncio.sleep(SILENCE_S)  # the window's length is the fault itself
        await c.do(c.cluster.heal, links)
        c.stop(SILENCE_FAULT, [leader])


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    schedule: Schedule
    nodes: int = 3
    producers: int = 4
    pause_s: float = 0.04  # between one producer's sends: ~100 msg/s for 4 producers
    flush_mode: str = "sync"
    async_flush_ms: int = 50
    churn_bound: bool = False  # leader changes are bounded (Pre-Vote + CheckQuorum's promise)
    silence: SilenceBound | None = None  # availability under a silent leader is bounded
    features: bool = False  # the messaging features run beside (chaos.live.features.driver)
    spares: int = 0  # nodes outside the group at the start (S17 adds and removes nodes)
    remoting: int = 0  # RocketMQ 4.x producers (the C++ client) beside ours (chaos.live.remoting)
    remoting_orderly: bool = False  # and a 4.x orderly producer and two orderly consumers
    grpc: bool = False  # the official RocketMQ 5 client's load beside (chaos.live.grpc_load)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    Scenario("S0", "Baseline, no faults", s0_baseline),
    # S1, S6 and S8 also run the messaging features (delay, orderly, retry) and their checkers
    Scenario("S1", "Leader isolation", s1_leader_isolation, features=True),
    Scenario("S2", "Random majority/minority split", s2_majority_minority),
    Scenario("S3", "Partial partition (one cut link)", s3_partial_partition, churn_bound=True),
    Scenario("S4", "Bridge (5 nodes)", s4_bridge, nodes=5, pause_s=0.08),
    Scenario("S5", "Majorities ring (5 nodes)", s5_majorities_ring, nodes=5, pause_s=0.08),
    Scenario("S6", "Kill -9 the leader", s6_kill_leader, features=True),
    Scenario("S7", "Kill -9 a random node or all", s7_kill_random_or_all),
    Scenario("S8", "Zombie leader (SIGSTOP/SIGCONT)", s8_zombie_leader, features=True),
    Scenario("S9", "Latency and jitter", s9_latency),
    Scenario("S10", "Packet loss (flapping links)", s10_loss),
    Scenario("S11", "Power loss of a minority", s11_power_loss_minority),
    Scenario("S12", "Power loss of all nodes", s12_power_loss_all),
    Scenario("S13", "Disk corruption of a stopped minority", s13_corruption()),
    Scenario("S14", "NameServer down while the leader is killed", s14_namesrv_and_leader),
    Scenario("S15", "Leadership transfer storm", s15_transfer_storm),
    # one producer sending one message at a time: the ack rate measures the client's failover
    Scenario("S16", "One-way silence of the leader", s16_leader_silence, producers=1, pause_s=0.0,
             silence=SilenceBound()),
    Scenario("S17", "Membership changes under kills and isolation", s17_membership, spares=2),
    # two C++ producers through the remoting endpoints beside two of ours, and a C++ orderly
    # producer with two orderly push consumers
    Scenario("S18", "RocketMQ 4.x clients while the leader is killed or isolated",
             s18_kill_or_isolate, producers=2, remoting=2, remoting_orderly=True),
    # the official RocketMQ 5 client through the gRPC endpoints (NORMAL, FIFO and batch sends,
    # SimpleConsumers), judged by the pop/FIFO and batch checkers, beside two of our producers
    Scenario("S19", "RocketMQ 5 clients (gRPC) while the leader is killed", s6_kill_leader,
             producers=2, grpc=True),
    Scenario("S20", "RocketMQ 5 clients (gRPC) under leader isolation", s1_leader_isolation,
             producers=2, grpc=True),
    # every send is retried by the library with its unique key: the dedup table at work
    Scenario("S21", "Lost answers (the leader's answers swallowed)", s21_lost_answers),
]}

CI_SUBSET = ("S1", "S2", "S3", "S6", "S8", "S12")
