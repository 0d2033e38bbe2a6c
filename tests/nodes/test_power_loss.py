"""Power loss of every node at once, on real processes: in ``sync`` flush mode no acknowledged
entry is lost; in ``async`` mode (page cache, flushed periodically) acknowledged entries can be.
The trade-off is measured here, not assumed. The power-loss switch discards every log byte written
since the last fsync (tearing the last write) and kills the process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from protocol.errors import DLedgerError
from tests.nodes.test_processes import _wait_leader, wait_until

pytestmark = pytest.mark.slow


async def _acked_then_power_loss(cluster: LocalCluster, count: int) -> tuple[dict[bytes, int], list[bytes]]:
    acked: dict[bytes, int] = {}
    async with LogClient(cluster.client_addresses, timeout_s=5.0) as client:
        await _wait_leader(client, cluster)

        async def writer(w: int) -> None:
            for k in range(count // 8):
                value = f"w{w}-{k}".encode()
                _, c = await client.propose(value)
                acked[value] = c.index

        await asyncio.gather(*(writer(w) for w in range(8)))
        for nid in cluster.servers:  # pull the plug on all of them
            try:
                await client.power_loss(nid, tear=True)
            except DLedgerError:
                pass  # the process may die before it answers
    for nid, s in cluster.servers.items():
        assert s.proc is not None
        s.proc.wait(timeout=10)
        cluster.kill(nid)
    for nid in cluster.servers:
        cluster.restart(nid)
    async with LogClient(cluster.client_addresses, timeout_s=5.0) as client:
        await _wait_leader(client, cluster)
        _, marker = await client.propose(b"after the power came back")

        async def all_applied() -> bool:
            try:
                commits = [(await client.status(n))["raft"]["commit_index"] for n in cluster.servers]
                return min(commits) >= marker.index
            except DLedgerError:
                return False

        await wait_until(all_applied, 30, "every node to commit after the restart")
        present = {e.data for e in await client.read_all("n0")}
    lost = [v for v in acked if v not in present]
    return acked, lost


def test_power_loss_of_all_nodes_in_sync_mode_loses_no_acknowledged_entry(tmp_path: Path) -> None:
    with LocalCluster(str(tmp_path), size=3, tick_ms=50, flush_mode="sync",
                      extra_args=("--test-faults",)) as cluster:
        acked, lost = asyncio.run(_acked_then_power_loss(cluster, 400))
    assert len(acked) == 400
    assert lost == []


def test_power_loss_of_all_nodes_in_async_mode_can_lose_acknowledged_entries(tmp_path: Path) -> None:
    # A flush interval longer than the run: everything acknowledged sits in the page cache.
    with LocalCluster(str(tmp_path), size=3, tick_ms=50, flush_mode="async",
                      extra_args=("--test-faults", "--async-flush-ms", "600000")) as cluster:
        acked, lost = asyncio.run(_acked_then_power_loss(cluster, 400))
    assert len(acked) == 400
    assert len(lost) > 0, "async flush mode was expected to lose acknowledged entries"
