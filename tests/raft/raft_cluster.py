"""A scripted in-memory cluster of Raft cores for the core's scenario tests.

Each node is a core plus in-memory stores, with the shell's Ready contract done by hand: persist,
send, apply, advance. Messages go to a network list that tests deliver (all, some, or none), so
scenarios from the Raft paper can be replayed step by step.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from dledger.raft.config import Canaries, RaftConfig
from dledger.raft.core import RaftCore
from dledger.raft.types import Entry, EntryKind, HardState, Message, Role, SnapshotMeta
from dledger.storage.memstore import MemoryHardStateStore, MemoryLogStore


@dataclass
class TestNode:
    node_id: str
    config: RaftConfig
    store: MemoryLogStore = field(default_factory=MemoryLogStore)
    hard_state: MemoryHardStateStore = field(default_factory=MemoryHardStateStore)
    applied: list[Entry] = field(default_factory=list)
    seed: int = 0
    installed: list[SnapshotMeta] = field(default_factory=list)  # snapshots installed, in order
    core: RaftCore = field(init=False)

    def __post_init__(self) -> None:
        self.start()

    def start(self) -> None:
        applied = self.applied[-1].index if self.applied else 0
        self.core = RaftCore(self.config, self.store, self.hard_state.load(),
                             random.Random(self.seed), applied_index=applied)

    def drain(self, outbox: list[Message]) -> None:
        """Run the Ready loop until the core has nothing more to do."""
        for _ in range(1000):
            if not self.core.has_ready():
                return
            rd = self.core.ready()
            outbox.extend(rd.early_messages)
            if rd.snapshot is not None:  # (the snapshot's data is elided: only its log's end)
                self.store.reset_to(rd.snapshot.index, rd.snapshot.term)
                self.installed.append(rd.snapshot)
            if rd.hard_state is not None:
                self.hard_state.save(rd.hard_state)
            if rd.entries:
                self.store.append(rd.entries)
            if rd.must_sync:
                self.store.sync()
            outbox.extend(rd.messages)
            self.applied.extend(rd.committed)
            self.core.advance(rd)
        raise AssertionError("ready loop did not settle")


class Cluster:
    def __init__(self, size: int = 3, seed: int = 1, canaries: Canaries | None = None,
                 **config_kw) -> None:
        self.ids = [f"n{i + 1}" for i in range(size)]
        self.nodes: dict[str, TestNode] = {}
        for k, nid in enumerate(self.ids):
            cfg = RaftConfig(node_id=nid, voters=tuple(self.ids),
                             canaries=canaries or Canaries(), **config_kw)
            self.nodes[nid] = TestNode(nid, cfg, seed=seed * 100 + k)
        self.network: list[Message] = []
        self.cut: set[tuple[str, str]] = set()  # directed links that drop messages
        self.down: set[str] = set()
        self.delivered = 0

    # -- faults --------------------------------------------------------------------------

    def isolate(self, nid: str) -> None:
        for other in self.ids:
            if other != nid:
                self.cut.add((nid, other))
                self.cut.add((other, nid))

    def heal(self) -> None:
        self.cut.clear()

    def crash(self, nid: str) -> None:
        self.down.add(nid)

    def restart(self, nid: str, lose_unsynced: bool = False) -> None:
        node = self.nodes[nid]
        if lose_unsynced:
            node.store.power_loss()
        node.applied = []
        node.start()
        self.down.discard(nid)

    # -- driving -------------------------------------------------------------------------

    def core(self, nid: str) -> RaftCore:
        return self.nodes[nid].core

    def drain_all(self) -> None:
        for nid in self.ids:
            if nid not in self.down:
                self.nodes[nid].drain(self.network)

    def deliver(self, pred: Callable[[Message], bool] | None = None, rounds: int = 200) -> None:
        """Deliver messages (those matching pred, others stay queued) until quiet."""
        for _ in range(rounds):
            self.drain_all()
            batch = [m for m in self.network if pred is None or pred(m)]
            if not batch:
                return
            self.network = [m for m in self.network if not (pred is None or pred(m))]
            for m in batch:
                if m.dst in self.down or m.src in self.down or (m.src, m.dst) in self.cut:
                    continue
                self.delivered += 1
                self.nodes[m.dst].core.step(m)
        self.drain_all()

    def tick(self, times: int = 1, nodes: Iterable[str] | None = None) -> None:
        for _ in range(times):
            for nid in nodes or self.ids:
                if nid not in self.down:
                    self.nodes[nid].core.tick()
            self.deliver()

    def elect(self, nid: str) -> None:
        self.core(nid).campaign()
        self.deliver()
        assert self.core(nid).role is Role.LEADER, self.core(nid).status()

    def leaders(self) -> list[str]:
        return [n for n in self.ids if n not in self.down and self.core(n).role is Role.LEADER]

    def propose(self, nid: str, data: bytes) -> tuple[int, int]:
        out = self.core(nid).propose(data)
        self.deliver()
        return out


def preset_log(node: TestNode, terms: list[int], hard_state: HardState) -> None:
    """Give a node a durable log with the given entry terms (index 1..n) and hard state."""
    entries = [Entry(i + 1, t, EntryKind.NORMAL, f"{i + 1}@{t}".encode()) for i, t in enumerate(terms)]
    node.store = MemoryLogStore()
    node.store.append(entries)
    node.store.sync()
    node.hard_state = MemoryHardStateStore(hard_state)
    node.applied = []
    node.start()
