"""A node whose disk fills up stays up (issue 16, item 5): it refuses appends with
``DiskFullError``, gives up leadership, answers nothing it could not write, keeps serving status
and reads, and rebuilds itself from disk once there is room again, while the rest of its group
carries on. In process, with the full disk injected for one node's data directory only (every
write under it fails with ENOSPC, and its free space reads as none); the real thing, a small
tmpfs filled up under real processes, is in ``test_disk_full_tmpfs``.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
import types
import uuid
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.server import BrokerServer
from broker.shell.checkpoint import CHECKPOINT_FILE
from dledger.node.runtime import Node, NodeConfig
from dledger.raft.types import Role
from protocol.broker_kinds import FOUND
from protocol.errors import DiskFullError, DLedgerError, NotLeaderError
from tests.log.test_runtime import configs, leader_of, running, wait_for


class FullDisk:
    """While ``full``: writes (pwrite, write) to files whose path starts with ``prefix`` fail
    with ENOSPC, and so does their fdatasync if ``fsync_too``; statvfs there shows no free
    space. Files elsewhere (the other nodes') are untouched. ``under(dir)`` makes a prefix."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, prefix: str, fsync_too: bool = False,
                 writes: tuple[str, ...] = ("pwrite", "write")) -> None:
        self.root = prefix
        self.full = False
        self.refused = 0
        self._real = {name: getattr(os, name) for name in ("pwrite", "write", "fdatasync", "statvfs")}
        for name in writes:  # (over any FullDisk made before: they chain)
            monkeypatch.setattr(os, name, self._refusing(name))
        if fsync_too:
            monkeypatch.setattr(os, "fdatasync", self._refusing("fdatasync"))
        monkeypatch.setattr(os, "statvfs", self._statvfs)

    def _ours(self, fd: int) -> bool:
        try:
            return os.readlink(f"/proc/self/fd/{fd}").startswith(self.root)
        except OSError:
            return False

    def _refusing(self, name: str):
        real = self._real[name]

        def call(fd: int, *args):
            if self.full and self._ours(fd):
                self.refused += 1
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, *args)
        return call

    def _statvfs(self, path):
        st = self._real["statvfs"](path)
        if self.full and (os.path.abspath(path) + os.sep).startswith(self.root):
            return types.SimpleNamespace(f_bavail=0, f_frsize=st.f_frsize)
        return st


def under(dir_path: str | Path) -> str:
    return os.path.abspath(dir_path) + os.sep


def _leader_and_a_follower(nodes: list[Node]) -> tuple[Node, Node]:
    leader = leader_of(nodes)
    return leader, next(n for n in nodes if n is not leader)


def _log(node: Node) -> list[tuple[int, int, bytes]]:
    return [(e.index, e.term, e.data) for e in node.read_committed(1, max_entries=100_000)]


async def _propose_somewhere(nodes: list[Node], data: bytes, timeout_s: float) -> int:
    """Propose through whichever node leads, retrying until the deadline; returns the index."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        for n in nodes:
            if n.is_leader:
                try:
                    return (await n.propose(data, timeout_s=1.0)).index
                except DLedgerError as err:
                    last = err
        await asyncio.sleep(0.02)
    raise AssertionError(f"no node committed {data!r} within {timeout_s} s: {last!r}")


async def _wait_frozen(node: Node, disk: FullDisk) -> None:
    await wait_for(lambda: disk.refused > 0, 5, "a write to be refused")
    await wait_for(lambda: node.failure is not None or node.status().disk_full, 5,
                   "the node to notice")
    assert node.failure is None, f"the node stopped: {node.failure!r}"
    assert node._task is not None and not node._task.done()
    st = node.status()
    assert st.disk_full and "no space" in (st.disk_full_error or "")
    assert st.raft.role is Role.FOLLOWER and st.raft.leader_id is None
    assert not node.is_leader
    with pytest.raises(DiskFullError):
        node.submit(b"refused")


async def _wait_rejoined(node: Node, others: list[Node], top: int) -> None:
    await wait_for(lambda: node.disk_full is None, 10, "the node to rebuild once there is room")
    assert node.failure is None
    await wait_for(lambda: node.status().raft.commit_index >= top, 10, "the node to catch up")
    await node.wait_applied(top, 10)
    leader = leader_of(others)
    await wait_for(lambda: _log(node)[:top] == _log(leader)[:top], 10, "identical logs")


def test_a_follower_whose_disk_fills_stays_up_answers_reads_and_rejoins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> None:
        async with running(configs(tmp_path, disk_probe_interval_s=0.05)) as nodes:
            leader, victim = _leader_and_a_follower(nodes)
            applied: list[int] = []
            victim.add_apply_listener(lambda batch: applied.extend(e.index for e in batch))
            before = [await leader.propose(b"before-%d" % k) for k in range(5)]
            await victim.wait_applied(before[-1].index, 5)
            disk = FullDisk(monkeypatch, under(victim.config.data_dir))
            disk.full = True
            during = [await leader.propose(b"during-%d" % k) for k in range(30)]  # without it
            await _wait_frozen(victim, disk)
            # It answered no append it could not write: it holds none of them, and the leader
            # never counted it for them.
            assert victim.store is not None and victim.store.last_index() < during[0].index
            progress = {f.node_id: f for f in leader.status().raft.followers}
            assert progress[victim.config.node_id].match_index < during[0].index
            # Reads of what it holds go on.
            held = [d for _, _, d in _log(victim)]
            assert [b"before-%d" % k for k in range(5)] == [d for d in held if d.startswith(b"be")]
            disk.full = False
            await _wait_rejoined(victim, [n for n in nodes if n is not victim], during[-1].index)
            assert applied == list(range(applied[0], applied[-1] + 1))  # once each, in order
            assert applied[-1] >= during[-1].index and disk.refused > 0

    asyncio.run(run())


@pytest.mark.parametrize("fault", ["write", "fsync"])
def test_a_leader_whose_disk_fills_gives_up_leadership_and_rejoins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    # "fsync": the writes land but the group commit's fdatasync fails with ENOSPC (the store
    # then refuses all work until it is reopened); the fsync thread is used, not AIO.
    async def run() -> None:
        cfgs = configs(tmp_path, disk_probe_interval_s=0.05, aio_fsync=False)
        async with running(cfgs) as nodes:
            old = leader_of(nodes)
            others = [n for n in nodes if n is not old]
            acked = [(await old.propose(b"before-%d" % k)).index for k in range(5)]
            disk = FullDisk(monkeypatch, under(old.config.data_dir), fsync_too=fault == "fsync",
                            writes=("pwrite", "write") if fault == "write" else ())
            disk.full = True
            with pytest.raises(DLedgerError):
                for k in range(50):  # the first write that fails freezes it
                    acked.append((await old.propose(b"lost-leader-%d" % k, timeout_s=2)).index)
            await _wait_frozen(old, disk)
            with pytest.raises(NotLeaderError):
                await old.read_barrier()
            await wait_for(lambda: any(n.is_leader for n in others), 10, "a new leader")
            for k in range(20):
                acked.append(await _propose_somewhere(others, b"new-%d" % k, 10))
            disk.full = False
            await _wait_rejoined(old, others, acked[-1])
            assert old.status().raft.role is Role.FOLLOWER
            held = {i for i, _, _ in _log(old)}
            assert set(acked) <= held  # every acknowledged entry, on the node that lost its disk

    asyncio.run(run())


def test_a_candidate_that_cannot_persist_its_vote_does_not_campaign(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Leadership is handed to a follower whose hard state cannot be written: it becomes a
    # candidate in memory, but its vote requests wait for that write, which fails. No other
    # node may see the new term; once the disk has room it is back at the term on disk.
    async def run() -> None:
        async with running(configs(tmp_path, disk_probe_interval_s=0.05)) as nodes:
            leader, victim = _leader_and_a_follower(nodes)
            rest = [n for n in nodes if n is not victim]
            top = (await leader.propose(b"x")).index
            await victim.wait_applied(top, 5)
            term, vote = victim.status().raft.term, victim.status().raft.voted_for
            disk = FullDisk(monkeypatch, under(victim.config.data_dir), writes=("write",))
            disk.full = True
            with pytest.raises(DLedgerError):
                await leader.transfer_leadership(victim.config.node_id, timeout_s=1.0)
            await _wait_frozen(victim, disk)
            top = await _propose_somewhere(rest, b"after", 10)  # the group goes on, same term
            assert {n.status().raft.term for n in rest} == {term}
            disk.full = False
            await wait_for(lambda: victim.disk_full is None, 10, "the rebuild")
            assert victim.core is not None and (victim.core.term, victim.core.voted_for) == (term, vote)
            await _wait_rejoined(victim, rest, top)
            assert {n.status().raft.term for n in nodes} == {term}

    asyncio.run(run())


def _raw(body: bytes) -> list[object]:
    return [[body, "", [], uuid.uuid4().hex, [], int(time.time() * 1000)]]


def test_a_broker_on_a_full_disk_keeps_serving_pulls_and_checkpoints_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A group of one: with its disk full it has no writable leader, but pulls of what it holds
    # are answered; its checkpoint writes fail without stopping the checkpointer; once there is
    # room it leads again, takes sends and writes its checkpoint.
    node = NodeConfig(group="g", node_id="n0", peers={"n0": ("127.0.0.1", 0)},
                      data_dir=str(tmp_path), tick_interval_s=0.02, disk_probe_interval_s=0.05)
    server = BrokerServer(BrokerConfig(node, admin_listen=None, checkpoint_interval_s=0.05))
    checkpoint = tmp_path / CHECKPOINT_FILE

    async def run() -> None:
        ckpt_disk = FullDisk(monkeypatch, str(checkpoint), writes=("write",))
        ckpt_disk.full = True  # first only the checkpoint's writes fail
        await server.start()
        try:
            await wait_for(lambda: server.broker.node.is_leader, 10, "the node to lead")
            for i in range(3):
                await server.broker.sends.send("t", 0, _raw(b"m%d" % i))
            await wait_for(lambda: ckpt_disk.refused > 0, 5, "a checkpoint write to be refused")
            await server.broker.sends.send("t", 0, _raw(b"m-after-a-refused-checkpoint"))
            assert server.checkpoints._task is not None and not server.checkpoints._task.done()
            disk = FullDisk(monkeypatch, under(tmp_path))
            disk.full = True
            with pytest.raises(DLedgerError):
                await server.broker.sends.send("t", 0, _raw(b"refused"))
            await wait_for(lambda: server.broker.node.disk_full is not None, 5, "the node to fail")
            assert server.status()["disk_full"] and server.status()["raft"]["role"] == "disk_full"
            assert not server.caught_up()  # /readyz: not ready
            status, nxt, _, _, rows = await server.broker.pull("t", 0, 0, 10, 1 << 20, 0, ["*"])
            assert status == FOUND and nxt == 4
            assert [r[1] for r in rows] == [b"m0", b"m1", b"m2", b"m-after-a-refused-checkpoint"]
            disk.full = ckpt_disk.full = False
            await wait_for(lambda: server.broker.node.is_leader, 10, "the node to lead again")
            await server.broker.sends.send("t", 0, _raw(b"m3"))
            await wait_for(checkpoint.exists, 10, "a checkpoint once there is room")
            assert not server.status()["disk_full"]
            # the checkpoint wrote the queue's units in its thread: they leave memory after it
            queues = server.broker.state.queue_store
            await wait_for(lambda: queues.dirty_bytes == 0, 10,  # type: ignore[attr-defined]
                           "the units a checkpoint wrote to leave memory")
        finally:
            await server.stop()

    asyncio.run(run())


def test_a_node_riding_out_a_full_disk_stops_cleanly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> None:
        cfg = NodeConfig(group="g", node_id="n0", peers={"n0": ("127.0.0.1", 0)},
                         data_dir=str(tmp_path), tick_interval_s=0.02, disk_probe_interval_s=0.05)
        node = Node(cfg)
        await node.start()
        try:
            await wait_for(lambda: node.is_leader, 10, "the node to lead")
            disk = FullDisk(monkeypatch, under(tmp_path))
            disk.full = True
            with pytest.raises(DLedgerError):
                await node.propose(b"x")
            await _wait_frozen(node, disk)
        finally:
            await asyncio.wait_for(node.stop(), 10)
        assert node.failure is None and node._task is not None and node._task.done()

    asyncio.run(run())
