"""The simulated world: Raft cores with in-memory disks, a lossy network, faults and clients,
all driven by one seed (docs/design.md, docs/testing.md).

Owns the node shell (the same Ready contract as the runtime: persist, fsync, send, apply,
advance), the network (drop, delay, duplicate, reorder, partitions of several shapes), crashes
that lose unsynced writes (sometimes tearing the last), restarts from durable state only, writes
that fail for want of space (the node stops taking part and later rebuilds its core from disk,
as ``dledger.node.disk_full`` does), tick skew, and simulated clients whose acknowledged proposals
are checked at the end.
"""

from __future__ import annotations

import dataclasses
import heapq
import random
from collections import deque
from dataclasses import dataclass, field

from chaos.sim.membership import MembershipSettings, MembershipShell
from chaos.sim.node import SimNode
from chaos.sim.observer import Observer
from chaos.sim.snapshots import SnapshotSettings, SnapshotShell
from dledger.raft.config import Canaries, RaftConfig
from dledger.raft.types import Entry, EntryKind, InstallSnapshot, Message, Ready, Role
from protocol.errors import ProposalError

PARTITION_SHAPES = ("isolate_leader", "isolate_one", "majority_minority", "bridge", "one_link",
                    "one_way", "ring")


@dataclass(frozen=True)
class FaultSettings:
    """Everything a seed decides about the world; printed with every failure."""

    drop_rate: float
    dup_rate: float
    max_delay_ticks: int
    partition_shapes: tuple[str, ...]
    partition_ticks: tuple[int, int]  # each partition / each healthy gap lasts this long
    crash_rate: float  # per tick
    down_ticks: tuple[int, int]
    tick_rates: tuple[float, ...]  # per node: ticks per world step (skew)
    proposals_max: int  # per world step
    mid_ready_crash_rate: float  # per Ready: crash after early sends, before persisting
    max_append_entries: int
    max_inflight: int
    new_leader_crash_rate: float  # a new leader is killed within a few ticks (leader flapping)
    new_leader_isolate_rate: float  # a new leader is cut off before its no-op spreads
    defer_sync_rate: float  # share of a leader's Readies whose fsync runs in the background
    cache_bytes_max: int  # the core's cache of persisted entries (0: every read hits the store)
    transfer_rate: float  # per tick: the leader is asked to hand leadership to a random node
    preferred_leader: str | None
    retain_rate: float  # per tick and node: delete what safe_retain_index allows
    quorum_first: bool  # leaders send new entries at once only to the followers a commit needs
    lazy_batch_entries: int  # quorum-first: a lazy follower's batch (else it waits for a heartbeat)
    # per Ready: one of its writes (hard state, entries, or their fsync) fails for want of space.
    # Drawn from a generator of its own, so that a seed drawing 0 runs the world it always ran.
    write_fail_rate: float = 0.0

    @staticmethod
    def draw(rng: random.Random, nodes: int) -> FaultSettings:
        shapes = [s for s in PARTITION_SHAPES if rng.random() < 0.6] or [rng.choice(PARTITION_SHAPES)]
        lo = rng.randint(30, 100)
        rates = [1.0] * nodes
        rates[rng.randrange(nodes)] = round(rng.uniform(0.5, 2.0), 2)
        return FaultSettings(
            drop_rate=round(rng.uniform(0.0, 0.2), 3),
            dup_rate=round(rng.uniform(0.0, 0.05), 3),
            max_delay_ticks=rng.randint(0, 10),
            partition_shapes=tuple(shapes),
            partition_ticks=(lo, lo + rng.randint(20, 150)),
            crash_rate=round(rng.uniform(0.005, 0.02), 4),
            down_ticks=(5, rng.randint(20, 80)),
            tick_rates=tuple(rates),
            proposals_max=rng.randint(1, 3),
            mid_ready_crash_rate=round(rng.uniform(0.0, 0.004), 4),
            max_append_entries=rng.choice((1, 2, 4, 64, 512)),
            max_inflight=rng.choice((1, 4, 32)),
            new_leader_crash_rate=rng.choice((0.0, 0.0, 0.2, 0.5)),
            new_leader_isolate_rate=rng.choice((0.0, 0.0, 0.3, 0.6)),
            defer_sync_rate=rng.choice((0.0, 0.5, 1.0)),
            cache_bytes_max=rng.choice((0, 2048, 1 << 20)),
            transfer_rate=rng.choice((0.0, 0.0, 0.01, 0.03)),
            preferred_leader=rng.choice((None, None, None, "n1")),
            retain_rate=rng.choice((0.0, 0.05, 0.3)),
            quorum_first=rng.random() < 0.5,
            lazy_batch_entries=rng.choice((1, 4, 256)),
        )


@dataclass(order=True)
class _InFlight:
    at: int
    seq: int
    msg: Message = field(compare=False)


@dataclass
class Proposal:
    value: bytes
    node: str
    term: int
    index: int


class World:
    def __init__(self, seed: int, node_count: int, canaries: Canaries,
                 faults: FaultSettings | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.disk_rng = random.Random(f"disk-{seed}")  # full-disk faults only (see write_fail_rate)
        self.faults = faults or dataclasses.replace(
            FaultSettings.draw(self.rng, node_count),
            write_fail_rate=self.disk_rng.choice((0.0, 0.0, 0.002, 0.01)))
        members = MembershipSettings.draw(random.Random(f"members-settings-{seed}"))
        self.members = MembershipShell(self, members, seed)
        initial = [f"n{i + 1}" for i in range(node_count)]
        self.ids = initial + [f"n{node_count + k + 1}" for k in range(members.spares)]
        self.observer = Observer()
        self.now = 0
        self.events = 0
        self.fault_counts: dict[str, int] = {}
        self.trail: deque[str] = deque(maxlen=40)
        self._net: list[_InFlight] = []
        self._seq = 0
        self.cut: set[tuple[str, str]] = set()
        self.partition_until = 0
        self.healthy_until = 0
        self.healing = False
        self.pending: dict[tuple[str, int, int], Proposal] = {}
        self.acked: dict[bytes, Proposal] = {}
        self.proposed = 0
        self.leader_guess: str | None = None
        self.known_leaders: set[tuple[str, int]] = set()
        self.doomed: dict[str, int] = {}  # node -> tick at which it will be killed
        self.snapshots = SnapshotShell(self, SnapshotSettings.draw(random.Random(f"snap-{seed}")))
        self.nodes = [SimNode(self, nid, RaftConfig(
            node_id=nid, voters=tuple(initial), join=nid not in initial, canaries=canaries,
            max_append_entries=self.faults.max_append_entries,
            max_inflight=self.faults.max_inflight,
            max_cache_bytes=self.faults.cache_bytes_max,
            preferred_leader=self.faults.preferred_leader,
            quorum_first=self.faults.quorum_first,
            lazy_batch_entries=self.faults.lazy_batch_entries)) for nid in self.ids]
        self.by_id = {n.id: n for n in self.nodes}

    # -- network ---------------------------------------------------------------------------------

    def send(self, m: Message) -> None:
        if isinstance(m, InstallSnapshot):
            self.snapshots.start(m)  # its data streams for a while (chaos.sim.snapshots)
            return
        f = self.faults
        if not self.healing and self.rng.random() < f.drop_rate:
            return
        copies = 2 if not self.healing and self.rng.random() < f.dup_rate else 1
        for _ in range(copies):
            delay = self.rng.randint(0, f.max_delay_ticks) if not self.healing else self.rng.randint(0, 1)
            self._seq += 1
            heapq.heappush(self._net, _InFlight(self.now + delay, self._seq, m))

    def _deliver_due(self) -> None:
        due: list[Message] = []
        while self._net and self._net[0].at <= self.now:
            due.append(heapq.heappop(self._net).msg)
        self.rng.shuffle(due)  # same-tick messages arrive in any order
        for m in due:
            dst = self.by_id[m.dst]
            if not dst.up or (m.src, m.dst) in self.cut:
                continue
            self.event(f"deliver {type(m).__name__} {m.src}->{m.dst} t{m.term}")
            dst.core.step(m)
            dst.drain()
            self.observe(dst)

    # -- clients -----------------------------------------------------------------------------------

    def _propose(self) -> None:
        for _ in range(self.rng.randint(0, self.faults.proposals_max)):
            target = self.leader_guess if self.leader_guess and self.rng.random() < 0.8 \
                else self.rng.choice(self.ids)
            node = self.by_id[target]
            if not node.up:
                self.leader_guess = None
                continue
            value = f"s{self.seed}-p{self.proposed}".encode()
            self.proposed += 1
            try:
                term, index = node.core.propose(value)
            except ProposalError as err:
                self.leader_guess = getattr(err, "leader_hint", None)
                continue
            self.leader_guess = target
            self.pending[(target, term, index)] = Proposal(value, target, term, index)
            self.event(f"propose {value.decode()} at {target} -> ({term}, {index})")
            node.drain()
            self.observe(node)

    def on_applied(self, node: SimNode, e: Entry) -> None:
        p = self.pending.pop((node.id, e.term, e.index), None)
        if p is not None and e.kind is EntryKind.NORMAL and e.data == p.value:
            self.acked[p.value] = p  # the client hears "committed"

    # -- faults -----------------------------------------------------------------------------------

    def _faults_step(self) -> None:
        f = self.faults
        if self.now >= self.partition_until and self.cut:
            self.cut = set()
            self.healthy_until = self.now + self.rng.randint(*f.partition_ticks)
            self.event("heal partition")
        elif not self.cut and self.now >= self.healthy_until and f.partition_shapes:
            shape = self.rng.choice(f.partition_shapes)
            self.cut = self._partition(shape)
            self.partition_until = self.now + self.rng.randint(*f.partition_ticks)
            self.count(f"partition:{shape}")
            self.event(f"partition {shape} cut={sorted(self.cut)}")
        self._admin_step()
        if self.rng.random() < f.crash_rate:
            up = [n for n in self.nodes if n.up]
            leaders = [n for n in up if n.core.role is Role.LEADER]
            if leaders and self.rng.random() < 0.5:
                self._crash(leaders[0], "crash_leader")
            elif up:
                self._crash(self.rng.choice(up), "crash")
        for nid, at in list(self.doomed.items()):
            node = self.by_id[nid]
            if self.now >= at:
                del self.doomed[nid]
                if node.up:
                    self._crash(node, "crash_new_leader")
        for n in self.nodes:
            if not n.up and self.now >= n.down_until:
                n.restart()
                self.count("restart")
                self.event(f"restart {n.id} at term {n.core.term}")
                self.observe(n)

    def _admin_step(self) -> None:
        """Operator actions: leadership transfers, snapshots and retention."""
        f = self.faults
        for n in self.nodes:
            if not n.up:
                continue
            if n.core.role is Role.LEADER:
                self.members.maybe_change(n)
            voters = [x for x in n.core.voters if x != n.id]
            if n.core.role is Role.LEADER and voters and self.rng.random() < f.transfer_rate:
                to = self.rng.choice(voters)
                n.core.transfer_leadership(to)
                self.count("transfer")
                self.event(f"transfer leadership {n.id} -> {to}")
                n.drain()
                self.observe(n)
            self.snapshots.maybe_take(n)
            if self.rng.random() < f.retain_rate:
                self.snapshots.retain(n)

    def defer_sync(self, node: SimNode, rd: Ready) -> bool:
        """Whether this leader Ready's fsync runs in the background (as the runtime does)."""
        return node.core.can_defer_sync(rd) and self.rng.random() < self.faults.defer_sync_rate

    def crash_now(self, node: SimNode) -> bool:
        """Called by a node in the middle of its Ready: maybe the power fails right here."""
        if self.healing or self.rng.random() >= self.faults.mid_ready_crash_rate:
            return False
        self._crash(node, "crash_mid_ready")
        return True

    def write_fails(self, node: SimNode, what: str) -> bool:
        """Called by a node before each write of a Ready: maybe it fails for want of space. The
        node then stops taking part (it answers nothing, as the runtime's frozen core) until
        the disk has room again, and comes back rebuilt from disk."""
        if self.healing or self.disk_rng.random() >= self.faults.write_fail_rate:
            return False
        node.up, node.disk_full = False, True
        node.down_until = self.now + self.disk_rng.randint(*self.faults.down_ticks)
        self._drop_pending_of(node.id)
        self.count("disk_full")
        self.event(f"disk full at {what} on {node.id} (durable last {node.store.last_index()})")
        return True

    def fsync_ignored(self, node: SimNode) -> bool:
        """Canary ``ignore_failed_fsync``: an fsync fails for want of space (drawn as in
        ``write_fails``) and the node carries on as if its entries were durable."""
        if not node.config.canaries.ignore_failed_fsync or self.healing:
            return False
        if self.disk_rng.random() >= self.faults.write_fail_rate:
            return False
        self.count("disk_full_ignored")
        self.event(f"fsync failed for want of space on {node.id}; carrying on (canary)")
        return True

    def _crash(self, victim: SimNode, kind: str) -> None:
        victim.crash(self.rng)
        victim.down_until = self.now + self.rng.randint(*self.faults.down_ticks)
        self._drop_pending_of(victim.id)
        self.count(kind)
        self.event(f"{kind} {victim.id} (durable last {victim.store.last_index()})")

    def _partition(self, shape: str) -> set[tuple[str, str]]:
        ids = self.ids[:]
        self.rng.shuffle(ids)
        n = len(ids)
        leaders = [x.id for x in self.nodes if x.up and x.core.role is Role.LEADER]
        if shape == "isolate_leader" and leaders:
            ids.remove(leaders[0])
            ids.insert(0, leaders[0])
        if shape in ("isolate_one", "isolate_leader"):
            groups = [ids[:1], ids[1:]]
        elif shape == "majority_minority":
            k = self.rng.randint(1, (n - 1) // 2)
            groups = [ids[:k], ids[k:]]
        elif shape in ("one_link", "one_way"):
            a, b = ids[0], ids[1]
            return {(a, b)} if shape == "one_way" else {(a, b), (b, a)}
        elif shape == "bridge":
            # two halves that only talk through one bridge node
            half = (n - 1) // 2
            left, right = ids[1 : 1 + half], ids[1 + half :]
            return {(a, b) for a in left for b in right} | {(b, a) for a in left for b in right}
        else:  # ring: each node hears only its two ring neighbours
            keep = {(ids[i], ids[(i + d) % n]) for i in range(n) for d in (1, -1)}
            return {(a, b) for a in ids for b in ids if a != b and (a, b) not in keep}
        return {(a, b) for g in groups for h in groups if g is not h for a in g for b in h}

    def _drop_pending_of(self, nid: str) -> None:
        for key in [k for k in self.pending if k[0] == nid]:
            del self.pending[key]

    # -- time ----------------------------------------------------------------------------------------

    def step(self) -> None:
        self.now += 1
        if not self.healing:
            self._faults_step()
            self._propose()
        for n in self.nodes:
            if n.up and n.background_syncs:
                n.finish_background_syncs()
                self.observe(n)
        self.snapshots.step()
        for n, rate in zip(self.nodes, self.faults.tick_rates):
            if not n.up:
                continue
            n.tick_credit += rate
            while n.tick_credit >= 1.0 and n.up:
                n.tick_credit -= 1.0
                n.core.tick()
                n.drain()
                self.events += 1
                self.observe(n)
            if n.core.role is Role.LEADER:
                self.leader_guess = n.id
        self._deliver_due()

    def observe(self, node: SimNode | None = None) -> None:
        """The invariants after an event: the node it changed (every node when it names none:
        an event changes one node's state, and the others' were checked when they last
        changed), and what spans the nodes."""
        self.observer.after_event(self.nodes, node)
        f = self.faults
        if self.healing or not (f.new_leader_crash_rate or f.new_leader_isolate_rate):
            return
        for n in self.nodes:
            if n.up and n.core.role is Role.LEADER and (n.id, n.core.term) not in self.known_leaders:
                self.known_leaders.add((n.id, n.core.term))
                if self.rng.random() < f.new_leader_crash_rate:
                    self.doomed[n.id] = self.now + self.rng.randint(0, 3)
                elif self.rng.random() < f.new_leader_isolate_rate:
                    self._isolate_new_leader(n.id)

    def _isolate_new_leader(self, nid: str) -> None:
        """Cut a leader off the moment it is elected: its no-op stays local (a Figure 8 step)."""
        if not self.cut:
            self.partition_until = self.now + self.rng.randint(*self.faults.partition_ticks)
        self.cut |= {(nid, o) for o in self.ids if o != nid} | {(o, nid) for o in self.ids if o != nid}
        self.count("partition:isolate_new_leader")
        self.event(f"isolate new leader {nid}")

    def event(self, text: str) -> None:
        self.events += 1
        self.trail.append(f"[{self.now}] {text}")

    def count(self, kind: str) -> None:
        self.fault_counts[kind] = self.fault_counts.get(kind, 0) + 1

    # -- heal phase ---------------------------------------------------------------------------------

    def heal(self) -> None:
        """Stop all faults, bring every node back, deliver reliably."""
        self.healing = True
        self.cut = set()
        self.faults = FaultSettings(**{**self.faults.__dict__, "tick_rates": (1.0,) * len(self.ids)})
        for n in self.nodes:
            if not n.up:
                n.restart()
        self.event("heal: faults stopped, all nodes up")
