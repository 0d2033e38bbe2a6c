"""Real nodes over the in-memory seams: three ``Node``s (the runtime loop, the Raft core, the Ready
pipeline) on ``MemoryLogStore``/``MemoryHardStateStore`` and a ``MemoryNetwork``, in one event
loop, with no socket and no file. Also the in-memory network on its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from dledger.network.memory import UNATTRIBUTED, MemoryNetwork, MemoryTransport
from dledger.network.seams import Address, OnMessage, OnStream, Resolve, Transport
from dledger.node.config import AppliedEntry, Committed
from dledger.node.runtime import Node, NodeConfig
from dledger.raft.types import (
    AppendResponse,
    EntryKind,
    Heartbeat,
    HeartbeatResponse,
    Message,
    VoteRequest,
    VoteResponse,
)
from dledger.storage.memstore import MemoryHardStateStore, MemoryLogStore
from protocol.errors import DiskFullError

GROUP = "g"


async def wait_until(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class Checked:
    """A ``Transport`` that records every message leaving before what it depends on is durable
    (the node's durability contract): a granted vote before the vote, an acknowledgement of
    entries before those entries, any message before its term."""

    def __init__(self, inner: MemoryTransport, log: MemoryLogStore,
                 hard_state: MemoryHardStateStore, broken: list[str]) -> None:
        self.inner, self.log, self.hard_state, self.broken = inner, log, hard_state, broken

    def attach(self, on_message: OnMessage, *, on_batch_end: Callable[[], None] | None = None,
               on_stream: OnStream | None = None, resolve: Resolve | None = None) -> None:
        self.inner.attach(on_message, on_batch_end=on_batch_end, on_stream=on_stream,
                          resolve=resolve)

    async def start(self) -> Address:
        return await self.inner.start()

    async def stop(self) -> None:
        await self.inner.stop()

    def set_dial(self, peer: str, addr: Address) -> None:
        self.inner.set_dial(peer, addr)

    def stats(self) -> dict[str, dict[str, int]]:
        return self.inner.stats()

    def send(self, msg: Message) -> bool:
        saved = self.hard_state.state
        pre_vote = isinstance(msg, (VoteRequest, VoteResponse)) and msg.pre_vote
        if not pre_vote and msg.term > saved.term:
            self.broken.append(f"{msg!r} left before term {msg.term} was saved ({saved})")
        if isinstance(msg, VoteResponse) and msg.granted and not pre_vote \
                and saved.voted_for != msg.dst:
            self.broken.append(f"{msg!r} left before the vote was saved ({saved})")
        if isinstance(msg, AppendResponse) and msg.success and msg.index >= self.log.first_index() \
                and self.log.durable_term_at(msg.index) != self.log.term_at(msg.index):
            self.broken.append(f"{msg!r} left before entry {msg.index} was synced")
        return self.inner.send(msg)


class Group:
    """Three nodes of one group on one MemoryNetwork, each with its stores and what it applied."""

    def __init__(self, tmp_path: Path, log: Callable[[], MemoryLogStore] = MemoryLogStore,
                 **config: Any) -> None:
        self.net = MemoryNetwork()
        self.peers = {f"n{i}": ("mem", i + 1) for i in range(3)}
        self.tmp_path = tmp_path
        self.config = {"tick_interval_s": 0.02, **config}
        self.logs = {nid: log() for nid in self.peers}
        self.hard_states = {nid: MemoryHardStateStore() for nid in self.peers}
        self.applied: dict[str, list[AppliedEntry]] = {}
        self.broken: list[str] = []
        self.nodes: dict[str, Node] = {}
        self.stopped: set[str] = set()

    async def start(self, nid: str) -> Node:
        """(Re)start node nid over its stores, with a new transport at its address."""
        cfg = NodeConfig(group=GROUP, node_id=nid, peers=self.peers,
                         data_dir=str(self.tmp_path / nid), **self.config)
        inner = self.net.transport(nid, GROUP, self.peers[nid], self.peers)
        transport: Transport = Checked(inner, self.logs[nid], self.hard_states[nid], self.broken)
        node = Node(cfg, log_store=self.logs[nid], hard_state=self.hard_states[nid],
                    transport=transport)
        seen = self.applied[nid] = []
        node.add_apply_listener(seen.extend)
        assert await node.start() == self.peers[nid]
        self.nodes[nid] = node
        self.stopped.discard(nid)
        return node

    async def stop(self, nid: str) -> None:
        self.stopped.add(nid)
        await self.nodes[nid].stop()

    def running(self) -> list[Node]:
        return [n for nid, n in self.nodes.items() if nid not in self.stopped]

    def leader(self) -> Node | None:
        """The one running leader that every running node follows, if there is one now."""
        leaders = [n for n in self.running() if n.is_leader]
        if len(leaders) != 1:
            return None
        lid = leaders[0].config.node_id
        ok = all(n.status().raft.leader_id == lid for n in self.running())
        return leaders[0] if ok else None

    async def stop_all(self) -> None:
        for node in self.nodes.values():
            await node.stop()


def applied_upto(entries: Sequence[AppliedEntry], index: int) -> bool:
    return bool(entries) and entries[-1].index >= index


def data_of(entries: Sequence[AppliedEntry]) -> list[bytes]:
    return [e.data for e in entries if e.kind is EntryKind.NORMAL]


def test_three_real_nodes_commit_apply_and_fail_over_on_memory_stores(tmp_path: Path) -> None:
    async def run() -> None:
        g = Group(tmp_path)
        try:
            for nid in g.peers:
                await g.start(nid)
            await wait_until(lambda: g.leader() is not None, 10, "a leader all follow")
            leader = g.leader()
            assert leader is not None
            sent = [b"one-%d" % k for k in range(10)] + [b"burst-%d" % k for k in range(30)]
            done: list[Committed] = [await leader.propose(d, timeout_s=5) for d in sent[:10]]
            done += await asyncio.gather(*(leader.propose(d, timeout_s=5) for d in sent[10:]))
            assert [c.index for c in done] == sorted({c.index for c in done})
            for c in done:  # acknowledged: durable on a majority when propose returned
                held = [log for log in g.logs.values() if log.durable_term_at(c.index) == c.term]
                assert len(held) >= 2, c
            top = done[-1].index
            await wait_until(lambda: all(applied_upto(g.applied[n], top) for n in g.peers), 5,
                             "every node to apply the proposals")
            first = [(e.index, e.term, e.data) for e in g.applied["n0"]]
            assert [e.index for e in g.applied["n0"]] == list(range(1, len(first) + 1))
            for nid in g.peers:  # the same entries in the same order everywhere
                assert [(e.index, e.term, e.data) for e in g.applied[nid]][:len(first)] == first
                assert data_of(g.applied[nid])[:len(sent)] == sent
            # At rest no node caches an entry: each is applied, and every peer of the leader
            # holds it (the cache is for replicating and applying, not a copy of the log).
            await wait_until(lambda: all(n.core is not None and n.core.log.cache_bytes == 0
                                         for n in g.running()), 5, "every node's cache to empty")

            # The leader stops: the others elect a new one, and proposals commit again.
            old, old_term = leader, leader.status().raft.term
            await g.stop(old.config.node_id)
            await wait_until(lambda: g.leader() is not None and g.leader() is not old, 10,
                             "a new leader")
            new = g.leader()
            assert new is not None and new.status().raft.term > old_term
            more = [b"after-%d" % k for k in range(15)]
            done += await asyncio.gather(*(new.propose(d, timeout_s=5) for d in more))
            top = done[-1].index
            live = [n.config.node_id for n in g.running()]
            await wait_until(lambda: all(applied_upto(g.applied[n], top) for n in live), 5,
                             "the running nodes to apply the later proposals")
            for nid in live:
                assert data_of(g.applied[nid]) == sent + more
            assert new.core is not None and new.core.log.cache_bytes > 0  # the stopped peer lags
            old_id = old.config.node_id
            await wait_until(lambda: new.status().transport[old_id]["dropped"] > 0, 5,
                             "messages to the stopped node to be dropped")
            assert g.net.dropped > 0

            # What was acknowledged is in the stores, durably, where it was committed.
            for c, data in zip(done, sent + more):
                for nid in live:
                    log = g.logs[nid]
                    assert log.durable_term_at(c.index) == c.term
                    assert log.position_of(c.index) == c.position
                    assert log.read_at(c.position).data == data
            for c in done[:len(sent)]:
                assert g.logs[old_id].durable_term_at(c.index) == c.term  # (it led then)
            assert all(g.hard_states[nid].state.term >= new.status().raft.term for nid in live)

            # The old leader restarts over its stores and catches up.
            back = await g.start(old_id)
            await wait_until(lambda: applied_upto(g.applied[old_id], top), 10,
                             "the restarted node to catch up")
            assert data_of(g.applied[old_id]) == sent + more
            assert [(e.index, e.term) for e in g.applied[old_id]][:top] == \
                [(e.index, e.term) for e in g.applied[live[0]]][:top]
            assert back.status().raft.leader_id is not None
        finally:
            await g.stop_all()
        assert g.broken == []  # the durability contract held on every message
        assert list(tmp_path.iterdir()) == []  # nothing written: no data directory made

    asyncio.run(run())


class FillingLog(MemoryLogStore):
    """A memory log whose writes fail for want of space while ``full``."""

    full = False

    def append(self, entries: Sequence[Any]) -> None:
        if self.full:
            raise DiskFullError("no space left (test)")
        super().append(entries)

    def sync(self) -> None:
        if self.full:
            raise DiskFullError("no space left (test)")
        super().sync()


def test_a_follower_whose_given_log_fills_rides_it_out_and_rejoins(tmp_path: Path) -> None:
    async def run() -> None:
        g = Group(tmp_path, log=FillingLog, disk_probe_interval_s=0.05)
        try:
            for nid in g.peers:
                await g.start(nid)
            await wait_until(lambda: g.leader() is not None, 10, "a leader all follow")
            leader = g.leader()
            assert leader is not None
            vid = next(nid for nid in g.peers if nid != leader.config.node_id)
            victim, log = g.nodes[vid], g.logs[vid]
            assert isinstance(log, FillingLog)
            sent = [b"before-%d" % k for k in range(5)]
            done = [await leader.propose(d, timeout_s=5) for d in sent]
            await wait_until(lambda: applied_upto(g.applied[vid], done[-1].index), 5, "apply")
            log.full = True
            during = [b"during-%d" % k for k in range(20)]
            done += [await leader.propose(d, timeout_s=5) for d in during]  # without it
            await wait_until(lambda: victim.disk_full is not None, 5, "the victim to freeze")
            assert victim.failure is None and victim.status().disk_full
            log.full = False
            await wait_until(lambda: victim.disk_full is None, 5, "a rebuild on the same store")
            top = done[-1].index
            await wait_until(lambda: applied_upto(g.applied[vid], top), 10, "the catch-up")
            assert victim.failure is None and g.nodes[vid].store is log
            assert [e.index for e in g.applied[vid]] == list(range(1, len(g.applied[vid]) + 1))
            assert data_of(g.applied[vid]) == sent + during  # once each, in order
            assert all(log.durable_term_at(c.index) == c.term for c in done)
        finally:
            await g.stop_all()
        assert g.broken == []

    asyncio.run(run())


def test_snapshots_are_refused_on_a_given_log_store(tmp_path: Path) -> None:
    async def run() -> None:
        net = MemoryNetwork()
        peers = {"a": ("mem", 1)}
        cfg = NodeConfig(group=GROUP, node_id="a", peers=peers, data_dir=str(tmp_path))
        node = Node(cfg, log_store=MemoryLogStore(), hard_state=MemoryHardStateStore(),
                    transport=net.transport("a", GROUP, peers["a"]))
        node.set_snapshot_provider(object())  # type: ignore[arg-type]  # (never called)
        with pytest.raises(ValueError, match="own log"):
            await node.start()

    asyncio.run(run())


# -- the in-memory network on its own ------------------------------------------------------------


def beat(src: str, dst: str, commit: int) -> Heartbeat:
    return Heartbeat(1, src, dst, commit)


def test_the_memory_network_delivers_asynchronously_in_order_in_batches() -> None:
    async def run() -> None:
        net = MemoryNetwork(queue_max=8)
        a = net.transport("a", GROUP, ("mem", 0), {"b": ("mem", 7)})
        b = net.transport("b", GROUP, ("mem", 7))
        got: list[Message] = []
        batches: list[int] = []
        a.attach(got.append)
        b.attach(got.append, on_batch_end=lambda: batches.append(len(got)))
        assert (await b.start()) == ("mem", 7)
        assert (await a.start())[1] not in (0, 7)  # port 0: a free one
        assert all(a.send(beat("a", "b", k)) for k in range(5))
        assert got == []  # delivered from the loop, never inside send
        await wait_until(lambda: len(got) == 5, 1, "delivery")
        assert [m.commit for m in got if isinstance(m, Heartbeat)] == list(range(5))
        assert batches == [5]  # one batch end for what was queued together
        # b learnt where a listens from its messages: it can answer
        assert b.send(HeartbeatResponse(1, "b", "a"))
        await wait_until(lambda: len(got) == 6, 1, "the answer")
        assert [a.send(beat("a", "b", k)) for k in range(10)] == [True] * 8 + [False] * 2
        assert a.stats()["b"]["dropped"] == 2  # the receiver's queue is bounded
        assert a.send(beat("a", "nobody", 0)) is False  # no address
        assert a.stats()[UNATTRIBUTED]["dropped"] == 1
        await b.stop()  # what was queued for it is dropped
        assert a.send(beat("a", "b", 99)) is False  # nobody listens there now
        assert a.stats()["b"] == a.stats()["b"] | {"dropped": 3, "sent": 13, "connected": 0}
        assert net.dropped == 2 + 1 + 8 + 1 and len(got) == 6  # (the 8 queued went too)
        other = net.transport("c", "another-group", ("mem", 7), {"a": a.address or ("", 0)})
        other.attach(got.append)
        await other.start()
        assert other.send(beat("c", "a", 0))  # queued, then refused by a: another group
        await wait_until(lambda: a.stats()[UNATTRIBUTED]["errors"] == 1, 1, "the refusal")
        assert len(got) == 6
        await a.stop()
        await other.stop()

    asyncio.run(run())
