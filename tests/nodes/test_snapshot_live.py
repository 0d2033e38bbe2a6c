"""Snapshots on real processes (issue 19, item 1): a follower is stopped, the others produce past
retention, its data directory is deleted, and it is started again: it installs a snapshot from
the leader (the leader's checkpoint and every log segment it retains), then follows the log, and
ends with the same state machine (consume queues, offsets, dedup table: one CRC32 of the whole)
and the same messages as the others; its key index, rebuilt from the log it received, finds a
message by key."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from client import Message, Producer, PullConsumer
from client.types import MessageQueue
from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from protocol import broker_kinds as bp
from protocol.errors import DLedgerError
from tests.broker.test_broker_processes import (
    BROKER,
    _start_namesrv,
    _wait_leader,
)
from tests.clusters import namesrv_group, routed
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow

TOPIC = "snap"
BODY = b"x" * 1000
# Small segments and a short lag bound, so that a few hundred messages retain a stopped
# member's entries away; checkpoints often, so that snapshots are recent.
SMALL_LOG = ("--retention-entries", "40", "--segment-bytes", "32768",
             "--retention-lag-entries", "60", "--checkpoint-interval-s", "0.3")


async def digests(client: LogClient, cluster: LocalCluster) -> dict[str, list[int]]:
    out = {}
    for nid, s in cluster.servers.items():
        if s.running:
            try:
                out[nid] = await client.call(nid, bp.STATE_DIGEST)
            except DLedgerError:
                pass
    return out


READ_ATTEMPTS = 5


async def queue_messages(client: LogClient, nid: str, queues: int) -> dict[int, tuple[int, dict[int, bytes]]]:
    """Per queue: the min offset this node serves and every message from there (offset: body).
    Retention may move a queue's min offset up while it is read (the small log's segments go
    as the node's periodic retention pass finds them past the bound: a loaded CI machine's
    once did): such a read starts again from the new min offset, a bounded number of times."""
    out = {}
    for qid in range(queues):
        for _ in range(READ_ATTEMPTS):
            read = await _read_queue(client, nid, qid)
            if read is not None:
                out[qid] = read
                break
        else:
            raise AssertionError(f"{nid} queue {qid}: its min offset moved {READ_ATTEMPTS} times")
    return out


async def _read_queue(client: LogClient, nid: str, qid: int) -> tuple[int, dict[int, bytes]] | None:
    """(min offset, offset: body) of one queue, or None if its min offset moved past the read."""
    status, _, lo, hi, _ = await client.call(nid, bp.PULL, TOPIC, qid, 0, 0, 1 << 20, 0, ["*"])
    got: dict[int, bytes] = {}
    offset = lo
    while offset < hi:
        status, nxt, now_lo, _, rows = await client.call(nid, bp.PULL, TOPIC, qid, offset, 256,
                                                         8 << 20, 0, ["*"])
        if status == bp.OFFSET_OUT_OF_RANGE and now_lo > offset:
            return None  # (retention passed the read)
        assert status == bp.FOUND, (nid, qid, offset, status)
        got.update({r[0]: bytes(r[1]) for r in rows})
        offset = nxt
    return lo, got


def test_a_wiped_follower_installs_a_snapshot_and_ends_like_the_others(tmp_path: Path) -> None:
    with namesrv_group(tmp_path, *SMALL_LOG) as (ns, cluster):
        asyncio.run(_scenario(ns, cluster))


async def _scenario(ns: str, cluster: LocalCluster) -> None:
    async with LogClient(cluster.client_addresses, timeout_s=5) as client, Producer(ns) as p:
        for i in range(50):
            await p.send(Message(TOPIC, BODY, keys=f"early-{i}"))
        async with PullConsumer(ns, "billing") as c:
            await c.commit(MessageQueue(TOPIC, "a", 0), 3)
        follower, sent = await _wipe_and_restart_a_follower(p, client, cluster, lambda _: None)
        await _converged(client, cluster, 60)
        st = await client.call(follower, bp.BROKER_STATUS)
        assert st["snapshot"]["installed"] == 1, st["snapshot"]
        # started with --join on an empty disk, it has caught up: it votes again, and says so
        await wait_until(lambda: not os.path.exists(
            os.path.join(cluster.servers[follower].data_dir, "recovering")), 10,
            "the recovering marker to go")
        st = await client.call(follower, bp.BROKER_STATUS)
        assert st["membership"]["recovering"] is False
        leader = await _wait_leader(client, cluster)
        assert (await client.call(leader, bp.BROKER_STATUS))["snapshot"]["sent"] >= 1

        queues = 4
        held = {n: await queue_messages(client, n, queues) for n in cluster.servers}
        for qid in range(queues):
            lows = {n: held[n][qid][0] for n in held}
            # the wiped node holds at least as much as some other node (all they retain)
            assert lows[follower] <= max(lo for n, lo in lows.items() if n != follower), lows
            common = max(lows.values())
            bodies = {n: {o: b for o, b in held[n][qid][1].items() if o >= common}
                      for n in held}
            assert len({tuple(sorted(b.items())) for b in bodies.values()}) == 1
        # (the digests being equal, so are the offsets: the leader's shows they count)
        assert await client.call(leader, bp.OFFSET_QUERY, "billing", TOPIC, 0) == 3
        # its key index, rebuilt from the log it was sent, finds a message by key
        found = await client.call(follower, bp.QUERY_BY_KEY, TOPIC, f"k-{sent - 1}", 0, 2**62, 8)
        assert [bytes(m[5]) for m in found] == [BODY]


# -- item 2: a transfer broken by a proxy fault, a crash during install ------------------------------


@contextlib.contextmanager
def proxied_group(base: Path, *broker_args: str) -> Iterator[tuple[str, LocalCluster, Any]]:
    """A NameServer and a 3-node group whose every peer link ``a -> b`` runs through the proxy
    ``a-b`` of an embedded Toxiproxy server; yields (NameServer, group, Toxiproxy client)."""
    from chaos.toxiproxy import ServerThread
    from chaos.toxiproxy.client import ToxiproxyClient, listen_address

    ns_proc, ns = _start_namesrv(base)
    try:
        with ServerThread() as toxi_server:
            toxi = ToxiproxyClient(toxi_server.url)
            cluster = LocalCluster(str(base / "a"), size=3, tick_ms=50, group="a",
                                   program=(*BROKER, *broker_args, "--namesrv", ns,
                                            "--register-interval-s", "1"))
            servers = cluster.servers
            for a in servers:
                dial = []
                for b, s in servers.items():
                    if a != b:
                        host, port = s.peer_address
                        proxy = toxi.create_proxy(f"{a}-{b}", f"{host}:{port}")
                        proxy_host, proxy_port = listen_address(proxy)
                        dial.append(f"{b}={proxy_host}:{proxy_port}")
                cluster.node_args[a] = ("--dial", ",".join(dial))
            with cluster:
                asyncio.run(routed(ns))
                yield ns, cluster, toxi
    finally:
        ns_proc.terminate()
        ns_proc.wait(timeout=10)


async def _wipe_and_restart_a_follower(p: Producer, client: LogClient, cluster: LocalCluster,
                                       before_restart: Callable[[str], None]) -> tuple[str, int]:
    """Stop a follower, produce until the others retained what it lacks, delete its data,
    call ``before_restart(follower)``, start it again; returns it and the messages sent."""
    leader = await _wait_leader(client, cluster)
    follower = next(n for n in cluster.servers if n != leader)
    before = (await client.call(follower, bp.BROKER_STATUS))["raft"]["last_index"]
    cluster.kill(follower, signal.SIGTERM)
    sent = 0

    async def retained_past_it() -> bool:
        nonlocal sent
        for _ in range(20):
            await p.send(Message(TOPIC, BODY, keys=f"k-{sent}"))
            sent += 1
        firsts = [(await client.call(n, bp.BROKER_STATUS))["storage_first_index"]
                  for n in cluster.servers if n != follower]
        return min(firsts) > before + 1
    await wait_until(retained_past_it, 60, "the others to retain what the follower lacks")
    shutil.rmtree(cluster.servers[follower].data_dir)
    # (the procedure for a lost disk: --join, so that it votes only once caught up again)
    cluster.node_args[follower] = (*cluster.node_args.get(follower, ()), "--join")
    before_restart(follower)
    cluster.restart(follower)
    return follower, sent


async def _converged(client: LogClient, cluster: LocalCluster, timeout_s: float) -> None:
    async def same() -> bool:
        got = await digests(client, cluster)
        return len(got) == 3 and len({tuple(d[:2]) for d in got.values()}) == 1
    await wait_until(same, timeout_s, "every node to hold the same state")


def test_a_transfer_cut_every_100_kb_by_a_proxy_completes_by_resuming(tmp_path: Path) -> None:
    # a larger log kept (~300 kB of messages), so that the snapshot is several times the cut
    args = ("--retention-entries", "300", "--segment-bytes", "32768",
            "--retention-lag-entries", "320", "--checkpoint-interval-s", "0.3")
    with proxied_group(tmp_path, *args) as (ns, cluster, toxi):
        async def scenario() -> None:
            async with LogClient(cluster.client_addresses, timeout_s=5) as client, \
                    Producer(ns) as p:
                def cut_links_into(follower: str) -> None:
                    for src in cluster.servers:
                        if src != follower:  # every connection into it closes after 100 kB
                            toxi.add_toxic(f"{src}-{follower}", "limit_data", "upstream",
                                           attributes={"bytes": 100_000})
                follower, _ = await _wipe_and_restart_a_follower(p, client, cluster,
                                                                 cut_links_into)
                await _converged(client, cluster, 90)
                leader = await _wait_leader(client, cluster)
                sent = (await client.call(leader, bp.BROKER_STATUS))["snapshot"]
                got = (await client.call(follower, bp.BROKER_STATUS))["snapshot"]
                assert got["installed"] == 1, got
                assert sent["send_failures"] >= 2 and sent["resumed_bytes"] > 100_000, sent
        asyncio.run(scenario())


@pytest.mark.parametrize("step", ["staged", "commit"])
def test_a_crash_during_install_restarts_and_installs(tmp_path: Path, step: str) -> None:
    with namesrv_group(tmp_path, *SMALL_LOG, "--test-faults") as (ns, cluster):
        async def scenario() -> None:
            async with LogClient(cluster.client_addresses, timeout_s=5) as client, \
                    Producer(ns) as p:
                def crash_at_install(follower: str) -> None:
                    cluster.node_args[follower] = (*cluster.node_args.get(follower, ()),
                                                   "--test-crash-in-install", step)
                follower, _ = await _wipe_and_restart_a_follower(p, client, cluster,
                                                                 crash_at_install)
                proc = cluster.servers[follower].proc
                assert proc is not None
                await wait_until(lambda: proc.poll() is not None, 60,
                                 f"{follower} to exit at the install step {step!r}")
                assert proc.returncode == 70, cluster.log_tail(follower)
                cluster.kill(follower)  # (reaps it)
                cluster.restart(follower)
                await _converged(client, cluster, 60)
                got = (await client.call(follower, bp.BROKER_STATUS))["snapshot"]
                # "staged": the next offer found every file held and sent nothing again;
                # "commit": the restart finished the install before the node opened its log
                assert got["installed"] == (1 if step == "staged" else 0), got
                if step == "staged":
                    leader = await _wait_leader(client, cluster)
                    sent = (await client.call(leader, bp.BROKER_STATUS))["snapshot"]
                    assert sent["resumed_bytes"] > 0, sent
        asyncio.run(scenario())
