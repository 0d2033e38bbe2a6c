"""A real full disk under real processes (issue 16, item 5): the leader's data directory is a
small tmpfs, filled up while the group takes proposals. The node must stay up (status and reads
answered, appends refused as DISK_FULL), the other two go on under a new leader, and once space
is freed it rebuilds itself, catches up and rejoins, with no acknowledged entry missing.

Needs root and a kernel that lets this process mount a tmpfs (CI runs as root); skipped with
the reason otherwise.
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
from pathlib import Path

import pytest

from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from protocol.errors import DLedgerError
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow

TMPFS_BYTES = 24 << 20
PAYLOAD_BYTES = 64 << 10  # large entries: the log's zero-filled tail (1 MiB) fills in a few


def _mount_tmpfs(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs",
                           str(path)], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")


def _fill(path: Path) -> Path:
    """Write a file in ``path`` until the filesystem is full; returns it."""
    filler = path / "filler"
    with open(filler, "wb", buffering=0) as f:  # (unbuffered: nothing left to fail on close)
        for chunk_bytes in (1 << 20, 4096, 512):
            for _ in range(TMPFS_BYTES // chunk_bytes + 1):
                try:
                    f.write(b"\xff" * chunk_bytes)
                except OSError as err:
                    assert err.errno == errno.ENOSPC, err
                    break
    return filler


async def _role(client: LogClient, nid: str) -> str | None:
    try:
        return (await client.status(nid))["raft"]["role"]
    except DLedgerError:
        return None


async def _leader(client: LogClient, nids: list[str]) -> str | None:
    for nid in nids:
        if await _role(client, nid) == "leader":
            return nid
    return None


async def _scenario(cluster: LocalCluster, victim_dir: Path) -> None:
    acked: dict[int, bytes] = {}
    async with LogClient(cluster.client_addresses, timeout_s=3.0) as client:
        leader = await client.wait_for_leader(20)
        if leader != "n2":
            await client.transfer(leader, "n2")
        await wait_until(lambda: _leader(client, ["n2"]), 20, "n2 to lead")
        for k in range(5):
            _, c = await client.propose(b"before-%d" % k)
            acked[c.index] = b"before-%d" % k
        filler = _fill(victim_dir)

        async def full() -> bool:  # keeps proposing: the group must go on meanwhile
            try:
                data = os.urandom(PAYLOAD_BYTES)
                _, c = await client.propose(data)
                acked[c.index] = data
            except DLedgerError:
                pass  # outcome unknown: not counted as acknowledged
            st = await client.status("n2")
            return bool(st.get("disk_full"))
        await wait_until(full, 60, "n2 to find its disk full")
        st = await client.status("n2")  # the process is up and answers
        assert cluster.servers["n2"].running and st["raft"]["role"] == "disk_full"
        assert "no space" in st["disk_full_error"]
        held = {e.index: e.data for e in await client.read("n2", 1)}
        assert all(held[i] == acked[i] for i in acked if i in held) and len(held) >= 5
        await wait_until(lambda: _leader(client, ["n0", "n1"]), 20, "a new leader")
        frozen_last = (await client.status("n2"))["storage_last_index"]
        for k in range(20):  # the group commits without it
            _, c = await client.propose(b"after-%d" % k)
            acked[c.index] = b"after-%d" % k
        assert (await client.status("n2"))["storage_last_index"] == frozen_last
        top = max(acked)

        filler.unlink()

        async def rejoined() -> bool:
            st = await client.status("n2")
            return not st["disk_full"] and st["raft"]["commit_index"] >= top
        await wait_until(rejoined, 30, "n2 to rebuild and catch up once space is freed")
        assert await _role(client, "n2") == "follower"
        new_leader = await _leader(client, ["n0", "n1"])
        assert new_leader is not None
        mine = {e.index: e.data for e in await client.read_all("n2") if e.index <= top}
        theirs = {e.index: e.data for e in await client.read_all(new_leader) if e.index <= top}
        assert mine == theirs
        assert all(mine[i] == data for i, data in acked.items())


def test_a_node_on_a_full_disk_stays_up_and_rejoins_when_space_is_freed(tmp_path: Path) -> None:
    cluster = LocalCluster(str(tmp_path))
    victim_dir = Path(cluster.servers["n2"].data_dir)
    victim_dir.mkdir(parents=True)
    _mount_tmpfs(victim_dir)
    try:
        cluster.start()
        try:
            asyncio.run(_scenario(cluster, victim_dir))
        except BaseException:
            print(cluster.log_tail("n2", 40))
            raise
        finally:
            cluster.stop()
    finally:
        subprocess.run(["umount", str(victim_dir)], capture_output=True, timeout=30, check=True)
