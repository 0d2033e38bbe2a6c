"""Membership changes on real processes (issue 19, item 3): under steady sends, a 3-node group
grows to 5 (two nodes started with --join, each added with `dledger group add-node`: a learner
until caught up, then a voter), shrinks back to 3 (`remove-node`, the leader included: its
leadership moves first), and has a node replaced (`replace-node`); no acknowledged send is lost,
and sends carry on throughout, pausing at most about one election's time. The NameServer's
routes and `dledger status` follow the membership."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import main as dledger_main
from client import Message, Producer, UnavailableError
from client.errors import ClientError
from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from protocol import broker_kinds as bp
from tests.broker.test_broker_processes import _wait_leader
from tests.clusters import namesrv_group
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow

TOPIC = "members"
PAUSE_MAX_S = 4.0  # an election at 50 ms ticks takes 0.5-1 s; a leadership move less


def _dledger(ns: str, *args: str) -> str:
    res = CliRunner().invoke(dledger_main, [*args[:2], "--namesrv", ns, *args[2:]])
    assert res.exit_code == 0, res.output
    return res.output


def _peer(cluster: LocalCluster, nid: str) -> str:
    host, port = cluster.servers[nid].peer_address
    return f"{host}:{port}"


class SteadySender:
    """Sends one message after another, recording what was acknowledged and the longest gap
    between two acknowledgements."""

    def __init__(self, ns: str) -> None:
        self.ns = ns
        self.acked: set[bytes] = set()
        self.failed = 0
        self.longest_gap_s = 0.0
        self._stop = asyncio.Event()

    async def run(self) -> None:
        async with Producer(self.ns, send_timeout_s=10.0) as p:
            last = time.monotonic()
            k = 0
            while not self._stop.is_set():
                body = b"m%06d" % k
                k += 1
                try:
                    await p.send(Message(TOPIC, body))
                except (ClientError, UnavailableError):
                    self.failed += 1  # (an outcome unknown: not counted as acknowledged)
                    continue
                now = time.monotonic()
                self.longest_gap_s = max(self.longest_gap_s, now - last)
                last = now
                self.acked.add(body)

    def stop(self) -> None:
        self._stop.set()


async def _all_bodies(cluster: LocalCluster) -> set[bytes]:
    """Every message of the topic, read from the group's leader (a follower may lag; a removed
    node that still runs would answer with what it had)."""
    got: set[bytes] = set()
    running = {n: a for n, a in cluster.client_addresses.items() if cluster.servers[n].running}
    async with LogClient(running, timeout_s=5) as client:
        leader = await _wait_leader(client, cluster)
        for qid in range(4):
            offset = 0
            while True:
                _status, nxt, _, hi, rows = await client.call(
                    leader, bp.PULL, TOPIC, qid, offset, 256, 8 << 20, 0, ["*"])
                got.update(bytes(r[1]) for r in rows)
                if nxt >= hi:
                    break
                offset = nxt
    return got


def test_grow_to_five_shrink_to_three_and_replace_a_node_under_steady_sends(tmp_path: Path) -> None:
    with namesrv_group(tmp_path, "--checkpoint-interval-s", "1", size=5, initial=3) as (ns, cluster):
        asyncio.run(_scenario(ns, cluster))


async def _scenario(ns: str, cluster: LocalCluster) -> None:
    sender = SteadySender(ns)
    sending = asyncio.create_task(sender.run())
    loop = asyncio.get_running_loop()

    async def cli(*args: str) -> str:
        return await loop.run_in_executor(None, _dledger, ns, *args)

    async def voters() -> list[str]:
        rows = json.loads(await loop.run_in_executor(None, _status_json, ns))
        return rows[0]["voters"]  # type: ignore[no-any-return]

    await wait_until(lambda: len(sender.acked) > 20, 30, "the first sends")
    for nid in ("n3", "n4"):
        await loop.run_in_executor(None, cluster.start_node, nid)
        out = await cli("group", "add-node", "a", nid, "--peer", _peer(cluster, nid))
        assert f"{nid} caught up and votes" in out, out
    assert await voters() == ["n0", "n1", "n2", "n3", "n4"]
    count_at_five = len(sender.acked)
    await wait_until(lambda: len(sender.acked) > count_at_five + 20, 30, "sends with 5 voters")

    async with LogClient(cluster.client_addresses, timeout_s=5) as client:
        leader = await _wait_leader(client, cluster)
    for nid in (leader, "n4"):  # the leader among them: its leadership moves first
        out = await cli("group", "remove-node", "a", nid)
        assert f"{nid} removed" in out, out
        # still running, it is no longer routed to: the leader's membership leaves it out
        await wait_until(lambda n=nid: n not in _routed_nodes(ns), 15,
                         f"the NameServer to stop routing to {nid}")
        cluster.kill(nid, signal.SIGTERM)
    assert len(await voters()) == 3

    spare = "n4"  # a fresh disk under a former member's name and address
    shutil.rmtree(cluster.servers[spare].data_dir)
    await loop.run_in_executor(None, cluster.start_node, spare)
    current = await voters()
    old = next(v for v in current if v != spare)
    out = await cli("group", "replace-node", "a", old, spare, "--peer", _peer(cluster, spare))
    assert f"{old} removed" in out, out
    cluster.kill(old, signal.SIGTERM)
    assert spare in await voters() and old not in await voters()
    count = len(sender.acked)
    await wait_until(lambda: len(sender.acked) > count + 20, 30, "sends after the replacement")

    sender.stop()
    await sending
    assert len(sender.acked) > 100 and sender.failed < len(sender.acked) / 10
    missing = sender.acked - await _all_bodies(cluster)
    assert not missing, f"{len(missing)} acknowledged sends lost, e.g. {sorted(missing)[:3]}"
    assert sender.longest_gap_s < PAUSE_MAX_S, sender.longest_gap_s


def _routed_nodes(ns: str) -> list[str]:
    with urllib.request.urlopen(f"http://{ns}/v1/cluster", timeout=5) as resp:
        groups = json.loads(resp.read())["groups"]
    return [n["node_id"] for g in groups if g["group"] == "a" for n in g["nodes"]]


def _status_json(ns: str) -> str:
    res = CliRunner().invoke(dledger_main, ["status", "--namesrv", ns, "--json"])
    assert res.exit_code in (0, 3), res.output
    return res.output
