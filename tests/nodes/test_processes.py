"""Three real log server processes on loopback, driven through the client.

The main claim: entries proposed while the leader is killed with SIGKILL (and restarted) are all
present, and the three logs end identical. No sleeps wait for anything: every wait polls a
condition with a deadline.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from chaos import traces
from dledger.client import LogClient
from dledger.localcluster import ClusterError, LocalCluster
from protocol.errors import DLedgerError, NotLeaderError

pytestmark = pytest.mark.slow


async def wait_until(pred: Callable[[], bool | Awaitable[bool]], timeout_s: float,
                     what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ok = pred()
        if inspect.isawaitable(ok):
            ok = await ok
        if ok:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


async def leader_of(client: LogClient, cluster: LocalCluster) -> str | None:
    for nid, s in cluster.servers.items():
        if not s.running:
            continue
        try:
            st = await client.status(nid)
        except DLedgerError:
            continue
        if st["raft"]["role"] == "leader":
            return nid
    return None


async def _kill_leader_during_proposals(cluster: LocalCluster, kills: int,
                                       followers_too: bool = False) -> None:
    """``kills`` times: SIGKILL the leader (after each follower in turn, if ``followers_too``)
    while eight proposers run, restart it once a new leader acknowledges; then check that the
    logs converge with every acknowledged entry where it was acknowledged."""
    acked: dict[bytes, tuple[int, int]] = {}
    unknown: list[bytes] = []
    stop = asyncio.Event()
    async with LogClient(cluster.client_addresses, timeout_s=3.0) as client:

        async def proposer(pid: int) -> None:
            for seq in range(100_000):
                if stop.is_set():
                    return
                value = f"p{pid}-{seq}".encode()
                try:
                    _, c = await client.propose(value)
                    acked[value] = (c.index, c.term)
                except DLedgerError:
                    unknown.append(value)  # not acknowledged: may or may not be in the log

        writers = [asyncio.create_task(proposer(p)) for p in range(8)]
        try:
            for _ in range(kills):
                floor = len(acked)
                await wait_until(lambda floor=floor: len(acked) >= floor + 50, 30,
                                 "acks before the kill")
                leader = await _wait_leader(client, cluster)
                victims = [n for n in cluster.servers if n != leader] if followers_too else []
                for victim in [*victims, leader]:
                    cluster.kill(victim)
                    after = len(acked)
                    await wait_until(lambda after=after: len(acked) >= after + 50, 30,
                                     f"acks with {victim} down")
                    cluster.restart(victim)
        finally:
            stop.set()
            await asyncio.gather(*writers)
        assert len(acked) >= kills * 100
        await _check_converged(client, cluster, acked)


async def _wait_leader(client: LogClient, cluster: LocalCluster) -> str:
    found: list[str] = []

    async def has_leader() -> bool:
        leader = await leader_of(client, cluster)
        if leader:
            found.append(leader)
        return leader is not None

    await wait_until(has_leader, 30, "a leader")
    return found[-1]


async def _check_converged(client: LogClient, cluster: LocalCluster,
                           acked: dict[bytes, tuple[int, int]]) -> None:
    top = max(i for i, _ in acked.values())

    async def all_caught_up() -> bool:
        try:
            commits = [(await client.status(n))["raft"]["commit_index"] for n in cluster.servers]
        except DLedgerError:
            return False
        return min(commits) >= top and len(set(commits)) == 1

    await wait_until(all_caught_up, 30, "every node to commit every acknowledged entry")
    logs = {n: [(e.index, e.term, e.data) for e in await client.read_all(n)] for n in cluster.servers}
    first = logs["n0"]
    for n, entries in logs.items():
        assert entries == first, f"{n}'s committed log differs from n0's"
    by_value = {data: (index, term) for index, term, data in first}
    missing = [v for v in acked if v not in by_value]
    assert not missing, f"{len(missing)} acknowledged entries lost, e.g. {missing[:5]}"
    moved = [v for v, where in acked.items() if by_value[v] != where]
    assert not moved, f"acknowledged entries at another index/term: {moved[:5]}"


def test_sigkill_the_leader_during_proposals_loses_no_acknowledged_entry(tmp_path: Path) -> None:
    with LocalCluster(str(tmp_path), size=3, tick_ms=50, trace=True) as cluster:
        asyncio.run(_kill_leader_during_proposals(cluster, kills=3))
    # The nodes' own traces (kept across the kills) satisfy Raft's invariants too.
    events = traces.load(cluster.trace_path(n) for n in cluster.servers)
    assert traces.check(events) == []
    seen = traces.summary(events)
    assert seen["starts"] == 6 and seen["leader_terms"] >= 4 and seen["commits"] > 0


def test_followers_redirect_proposals_to_the_leader(tmp_path: Path) -> None:
    async def run(cluster: LocalCluster) -> None:
        async with LogClient(cluster.client_addresses) as client:
            leader = await _wait_leader(client, cluster)
            follower = next(n for n in cluster.servers if n != leader)
            with pytest.raises(NotLeaderError) as err:
                await client.call(follower, 64, b"direct")
            assert err.value.leader_hint == leader
            client.leader = follower  # a stale guess: the client must follow the redirect
            node, committed = await client.propose(b"via redirect")
            assert node == leader and committed.index >= 2
            assert client.redirects >= 1

    with LocalCluster(str(tmp_path), size=3, tick_ms=50) as cluster:
        asyncio.run(run(cluster))


def test_sigterm_stops_a_server_cleanly(tmp_path: Path) -> None:
    cluster = LocalCluster(str(tmp_path), size=1, tick_ms=50)
    with cluster:
        async def commit_one() -> None:
            async with LogClient(cluster.client_addresses) as client:
                await client.wait_for_leader(20)
        asyncio.run(commit_one())
        proc = cluster.servers["n0"].proc
        assert proc is not None
    assert proc.returncode == 0
    assert "ERROR" not in cluster.log_tail("n0", 200)


def test_quorum_first_loses_no_acknowledged_entry_when_any_member_is_killed(tmp_path: Path) -> None:
    # Each follower in turn, so the one the leader replicates to first is among the killed.
    with LocalCluster(str(tmp_path), size=3, tick_ms=50,
                      extra_args=("--quorum-first", "--busy-poll-us", "300")) as cluster:
        asyncio.run(_kill_leader_during_proposals(cluster, kills=2, followers_too=True))


def test_a_node_that_cannot_start_takes_the_others_down_with_it(tmp_path: Path) -> None:
    """A node whose peer port is taken (another process bound it between the pick and the
    start) fails the cluster's start, and the nodes that did start are stopped: a CI run had
    left two brokers of such a start running after its test failed."""
    cluster = LocalCluster(str(tmp_path), size=3)
    with socket.socket() as squatter:
        squatter.bind(cluster.servers["n2"].peer_address)
        squatter.listen()
        with pytest.raises(ClusterError, match="n2 did not start"), cluster:
            pass
    started = [s for s in cluster.servers.values() if s.proc is not None]
    assert started and all(s.proc is not None and s.proc.poll() is not None for s in started)
