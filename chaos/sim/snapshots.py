"""Snapshots in the simulated world: nodes take snapshots of their state machine, retention cuts
the log to them (sometimes ignoring a lagging member, so that it must be sent one), and a
leader's ``InstallSnapshot`` becomes a transfer that takes several ticks and can be cut by a
partition, a crash of either end or a broken link; the follower's shell stages a finished
snapshot and installs it when its core hands it out. A transfer that got through may arrive a
second time (a retry whose first attempt was not lost), which is how a snapshot older than the
follower's commit index reaches it.

The simulated state machine is the chain of prefix hashes (``SimNode._chain``): a snapshot at
index i carries the chain up to i, which the observer checks against the committed chain.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from chaos.sim.node import SimNode
from dledger.raft.types import InstallSnapshot, Role, SnapshotMeta


class SnapshotWorld(Protocol):
    """What snapshot transfers use of the world (``chaos.sim.world.World``)."""

    @property
    def rng(self) -> random.Random: ...

    @property
    def now(self) -> int: ...

    @property
    def by_id(self) -> dict[str, SimNode]: ...

    @property
    def cut(self) -> set[tuple[str, str]]: ...

    @property
    def healing(self) -> bool: ...

    def count(self, kind: str) -> None: ...

    def event(self, text: str) -> None: ...

    def observe(self, node: SimNode | None = None) -> None: ...


@dataclass(frozen=True)
class SnapshotSettings:
    """What a seed decides about snapshots (drawn from a generator of their own, so that the
    rest of a seed's world is drawn as before)."""

    take_rate: float  # per tick and node: snapshot the state machine at its applied index
    cut_rate: float  # per tick of a transfer: the link breaks and the transfer fails
    transfer_ticks: tuple[int, int]  # how long a whole transfer takes
    ignore_members_rate: float  # share of retentions that do not wait for lagging members
    again_rate: float  # a finished transfer's InstallSnapshot is delivered a second time

    @staticmethod
    def draw(rng: random.Random) -> SnapshotSettings:
        return SnapshotSettings(
            take_rate=rng.choice((0.0, 0.02, 0.1)),
            cut_rate=rng.choice((0.0, 0.05, 0.2)),
            transfer_ticks=(1, rng.choice((2, 10, 40))),
            ignore_members_rate=rng.choice((0.0, 0.5, 1.0)),
            again_rate=rng.choice((0.0, 0.1, 0.5)),
        )


@dataclass
class Transfer:
    msg: InstallSnapshot
    chain: list[int] | None  # the snapshot's data: the prefix hashes up to msg.meta.index
    done_at: int


class SnapshotShell:
    """The world's part in snapshots: taking them, retention, and transfers in flight."""

    def __init__(self, world: SnapshotWorld, settings: SnapshotSettings) -> None:
        self.world = world
        self.settings = settings
        self.transfers: list[Transfer] = []
        self.again: list[Transfer] = []  # finished transfers to be delivered once more

    # -- nodes -----------------------------------------------------------------------------------

    def maybe_take(self, node: SimNode) -> None:
        """Snapshot the node's state machine where it is, if that is durable on its disk (a
        leader may apply what a quorum of others holds before its own fsync ends)."""
        if self.world.rng.random() >= self.settings.take_rate:
            return
        index = node.applied_index
        have = node.snapshot.index if node.snapshot is not None else 0
        if index <= have or index > node.store.durable_last_index():
            return
        meta = SnapshotMeta(index, node.store.term_at(index), node.core.membership_at(index))
        node.snapshot, node.snapshot_chain = meta, node._chain[:index]
        node.core.snapshot_taken(meta)
        self.world.count("snapshot_taken")
        self.world.observe(node)

    def retain(self, node: SimNode) -> None:
        """Retention as the file store does it: never past the node's snapshot nor what is not
        durable; usually not past what every member holds, sometimes regardless of members."""
        if node.snapshot is None:
            return
        before = node.store.first_index()
        target = min(node.snapshot.index + 1, node.store.durable_last_index() + 1)
        if self.world.rng.random() >= self.settings.ignore_members_rate:
            target = min(target, node.core.safe_retain_index())
        if node.store.retain_from(target) > before:
            self.world.count("retain")
            self.world.observe(node)

    # -- transfers ---------------------------------------------------------------------------------

    def start(self, m: InstallSnapshot) -> None:
        """A leader's InstallSnapshot: its data streams for a while before the follower has it."""
        src = self.world.by_id[m.src]
        chain = None  # (a snapshot the node does not hold: it fails, and cannot happen)
        if src.snapshot is not None and src.snapshot.index == m.meta.index:
            chain = list(src.snapshot_chain)
        lo, hi = self.settings.transfer_ticks
        self.transfers.append(Transfer(m, chain, self.world.now + self.world.rng.randint(lo, hi)))
        self.world.count("snapshot_sent")
        self.world.event(f"snapshot {m.meta.index} (term {m.meta.term}) {m.src}->{m.dst} starts")

    def step(self) -> None:
        """Each tick: a transfer whose link is cut, or either end down, fails (its leader is
        told); one that is done reaches its follower, then its leader is told it went through."""
        world = self.world
        still = []
        for t in self.transfers:
            m = t.msg
            src, dst = world.by_id[m.src], world.by_id[m.dst]
            broken = (t.chain is None or not src.up or not dst.up or (m.src, m.dst) in world.cut
                      or (not world.healing and world.rng.random() < self.settings.cut_rate))
            if broken:
                self._report(src, m, ok=False)
                world.count("snapshot_cut")
                world.event(f"snapshot {m.meta.index} {m.src}->{m.dst} cut")
            elif world.now >= t.done_at:
                assert t.chain is not None
                self.deliver(dst, m, t.chain)
                if world.rng.random() < self.settings.again_rate and not world.healing:
                    t.done_at = world.now + world.rng.randint(1, 30)  # once more, later
                    self.again.append(t)
                self._report(src, m, ok=True)
            else:
                still.append(t)
        self.transfers = still
        due = [t for t in self.again if t.done_at <= world.now]
        if due:
            self.again = [t for t in self.again if t.done_at > world.now]
            for t in due:
                assert t.chain is not None
                world.count("snapshot_again")
                self.deliver(world.by_id[t.msg.dst], t.msg, t.chain)

    def deliver(self, dst: SimNode, m: InstallSnapshot, chain: list[int]) -> None:
        if not dst.up:
            return
        dst.staged[(m.meta.index, m.meta.term)] = chain
        self.world.event(f"snapshot {m.meta.index} (term {m.meta.term}) reaches {m.dst}")
        dst.core.step(m)
        dst.drain()
        self.world.observe(dst)

    def _report(self, src: SimNode, m: InstallSnapshot, ok: bool) -> None:
        core = src.core
        if src.up and core.role is Role.LEADER and core.term == m.term:
            core.report_snapshot(m.dst, ok)
            src.drain()
            self.world.observe(src)
