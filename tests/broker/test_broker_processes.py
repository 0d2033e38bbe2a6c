"""The broker on real processes: a 3-node broker group, driven over its client protocol.

Sends return after commit with dense queue offsets; followers serve pulls of committed data; the
consume queues are identical on every replica, also after the leader is SIGKILLed during sends;
long polls are woken by a commit; retried sends are not stored twice; topics and offsets go
through the log.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from protocol import broker_kinds as bp
from protocol.envelope import RemoteError
from protocol.errors import DLedgerError, NotLeaderError
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow

BROKER = ("-m", "broker", "start")


async def _wait_leader(client: LogClient, cluster: LocalCluster) -> str:
    found: list[str] = []

    async def has_leader() -> bool:
        for n, s in cluster.servers.items():
            if not s.running:
                continue
            try:
                if (await client.call(n, bp.BROKER_STATUS))["raft"]["role"] == "leader":
                    found.append(n)
                    return True
            except DLedgerError:
                continue
        return False

    await wait_until(has_leader, 30, "a leader")
    return found[-1]


def msg(body: bytes, key: str = "", tags: str = "") -> list[Any]:
    return [body, tags, [], key, [], 0]


async def send(client: LogClient, topic: str, queue_id: int, *messages: list[Any]) -> list[Any]:
    _, result = await client.call_leader(bp.SEND, topic, queue_id, list(messages))
    return result


async def pull_all(client: LogClient, node: str, topic: str, queue_id: int) -> list[list[Any]]:
    out: list[list[Any]] = []
    offset = 0
    for _ in range(10_000):
        status, nxt, _, _, msgs = await client.call(node, bp.PULL, topic, queue_id, offset, 256,
                                                    1 << 20, 0, [])
        if status != bp.FOUND:
            return out
        out.extend(msgs)
        offset = nxt
    return out


async def queue_max(client: LogClient, node: str, topic: str, queue_id: int) -> int:
    return (await client.call(node, bp.PULL, topic, queue_id, 0, 0, 0, 0, []))[3]


def test_sends_pulls_and_identical_replicas_across_a_leader_kill(tmp_path: Path) -> None:
    async def run(cluster: LocalCluster) -> None:
        async with LogClient(cluster.client_addresses, timeout_s=5.0) as client:
            await _wait_leader(client, cluster)
            acked: dict[bytes, tuple[int, int]] = {}
            stop = asyncio.Event()

            async def producer(p: int) -> None:
                for seq in range(100_000):
                    if stop.is_set():
                        return
                    body = f"p{p}-{seq}".encode()
                    try:
                        res = await send(client, "orders", p % 4, msg(body, key=body.decode()))
                    except DLedgerError:
                        continue  # not acknowledged: may or may not be stored
                    acked[body] = (res[1], res[2][0])

            tasks = [asyncio.create_task(producer(p)) for p in range(4)]
            await wait_until(lambda: len(acked) >= 100, 30, "acks before the kill")
            leader = await _wait_leader(client, cluster)
            cluster.kill(leader)
            n = len(acked)
            await wait_until(lambda: len(acked) >= n + 100, 30, "acks from the new leader")
            cluster.restart(leader)
            stop.set()
            await asyncio.gather(*tasks)
            await _check_replicas(client, cluster, acked)

    with LocalCluster(str(tmp_path), size=3, tick_ms=50, program=BROKER) as cluster:
        asyncio.run(run(cluster))


async def _check_replicas(client: LogClient, cluster: LocalCluster,
                          acked: dict[bytes, tuple[int, int]]) -> None:
    expected = {q: 1 + max((o for qq, o in acked.values() if qq == q), default=-1) for q in range(4)}

    async def caught_up() -> bool:
        try:
            for n in cluster.servers:
                for q in range(4):
                    if await queue_max(client, n, "orders", q) < expected[q]:
                        return False
            return True
        except DLedgerError:
            return False

    await wait_until(caught_up, 30, "every replica to hold every acknowledged message")
    queues = {n: {q: await pull_all(client, n, "orders", q) for q in range(4)} for n in cluster.servers}
    first = queues["n0"]
    for n, qs in queues.items():
        assert qs == first, f"{n}'s consume queues differ from n0's"
    stored = {m[1]: (q, m[0]) for q, msgs in first.items() for m in msgs}
    for _q, msgs in first.items():
        assert [m[0] for m in msgs] == list(range(len(msgs))), "queue offsets are dense"
        bodies = [m[1] for m in msgs]
        assert len(bodies) == len(set(bodies)), "a message was stored twice"
        for p in range(4):  # one producer's sends to one queue are stored in send order
            seqs = [int(b.split(b"-")[1]) for b in bodies if b.startswith(b"p%d-" % p)]
            assert seqs == sorted(seqs)
    for body, where in acked.items():
        assert stored.get(body) == where, f"acknowledged {body!r} at {where}, stored at {stored.get(body)}"


def test_followers_redirect_writes_and_serve_committed_reads(tmp_path: Path) -> None:
    async def run(cluster: LocalCluster) -> None:
        async with LogClient(cluster.client_addresses, timeout_s=5.0) as client:
            leader = await _wait_leader(client, cluster)
            follower = next(n for n in cluster.servers if n != leader)
            with pytest.raises(NotLeaderError) as err:
                await client.call(follower, bp.SEND, "t", 0, [msg(b"x")])
            assert err.value.leader_hint == leader
            # a long poll on a follower is woken by the commit of a new message
            poll = asyncio.create_task(client.call(follower, bp.PULL, "t", 0, 0, 32, 1 << 20,
                                                   15_000, [], timeout_s=20))
            first = await send(client, "t", 0, msg(b"hello", tags="TagA"))
            status, nxt, _, hi, msgs = await asyncio.wait_for(poll, 10)
            assert (status, nxt, hi) == (bp.FOUND, 1, 1)
            assert msgs[0][1] == b"hello" and msgs[0][8] == first[3][0]
            # tag filtering happens on the broker by tag hash
            await send(client, "t", 0, msg(b"other", tags="TagB"))
            await wait_until(lambda: _max_is(client, follower, 2), 10, "the follower to commit")
            only_a = await client.call(follower, bp.PULL, "t", 0, 0, 32, 1 << 20, 0, ["TagA"])
            assert [m[1] for m in only_a[4]] == [b"hello"] and only_a[1] == 2
            out_of_range = await client.call(follower, bp.PULL, "t", 0, 5, 32, 1 << 20, 0, [])
            assert out_of_range[0] == bp.OFFSET_OUT_OF_RANGE and out_of_range[2:4] == [0, 2]

    with LocalCluster(str(tmp_path), size=3, tick_ms=50, program=BROKER) as cluster:
        asyncio.run(run(cluster))


async def _max_is(client: LogClient, node: str, n: int) -> bool:
    return await queue_max(client, node, "t", 0) >= n


def test_topics_dedup_and_offsets_go_through_the_log(tmp_path: Path) -> None:
    async def run(cluster: LocalCluster) -> None:
        async with LogClient(cluster.client_addresses, timeout_s=5.0) as client:
            leader = await _wait_leader(client, cluster)
            _, status = await client.call_leader(bp.TOPIC_PUT, "readonly", 2, 2, 4)
            assert status == "OK"
            with pytest.raises(RemoteError) as err:
                await send(client, "readonly", 0, msg(b"x"))
            assert err.value.code == "NO_PERMISSION"
            with pytest.raises(RemoteError) as err:
                await client.call_leader(bp.TOPIC_PUT, "TBW102", 1, 1, 6)
            assert err.value.code == "INVALID_TOPIC"
            a = await send(client, "d", 1, msg(b"m", key="UNIQ-1"))
            b = await send(client, "d", 3, msg(b"m", key="UNIQ-1"), msg(b"n", key="UNIQ-2"))
            assert b[4] == [True, False] and (b[5][0], b[2][0]) == (a[1], a[2][0])
            _, st = await client.call_leader(bp.OFFSET_COMMIT, "g1", "d", 1, 1)
            assert st == "OK"
            _, committed = await client.call_leader(bp.OFFSET_QUERY, "g1", "d", 1)
            assert committed == 1  # read on the leader, after its term's no-op is applied
            follower = next(n for n in cluster.servers if n != leader)
            with pytest.raises(NotLeaderError):  # a lagging replica could answer stale offsets
                await client.call(follower, bp.OFFSET_QUERY, "g1", "d", 1)
            status = await client.call(leader, bp.BROKER_STATUS)
            assert status["topics"]["d"]["write_queues"] == 4  # auto-created with 4 queues

    with LocalCluster(str(tmp_path), size=3, tick_ms=50, program=BROKER) as cluster:
        asyncio.run(run(cluster))


def _start_namesrv(tmp_path: Path, listen: str = "127.0.0.1:0") -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "namesrv", "--listen", listen],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = json.loads(proc.stdout.readline())
    host, port = line["listen"]
    return proc, f"{host}:{port}"


def test_brokers_register_with_the_namesrv_and_routes_follow_the_leader(tmp_path: Path) -> None:
    ns_proc, ns = _start_namesrv(tmp_path)

    async def route(session: aiohttp.ClientSession, topic: str) -> dict[str, Any] | None:
        async with session.get(f"http://{ns}/v1/topics/{topic}/route") as resp:
            return await resp.json() if resp.status == 200 else None

    async def run(cluster: LocalCluster) -> None:
        async with LogClient(cluster.client_addresses, timeout_s=5.0) as client, \
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            leader = await _wait_leader(client, cluster)
            await send(client, "routed", 0, msg(b"x"))
            got: list[dict[str, Any]] = []

            async def routed_to(node: str, nodes: int = 1) -> bool:
                r = await route(session, "routed")
                if r is not None and r["groups"][0]["leader"] == node \
                        and len(r["groups"][0]["nodes"]) >= nodes:
                    got.append(r)
                    return True
                return False

            # every node registers once it has caught up with the group
            await wait_until(lambda: routed_to(leader, 3), 15, "the route to name the leader")
            group = got[-1]["groups"][0]
            assert group["write_queues"] == 4 and len(group["nodes"]) == 3
            term = group["term"]
            cluster.kill(leader)
            new_leader = await _wait_leader(client, cluster)
            await wait_until(lambda: routed_to(new_leader), 15, "the route to follow the new leader")
            assert got[-1]["groups"][0]["term"] > term
            # the admin endpoints of the new leader
            admin = (await client.call(new_leader, bp.BROKER_STATUS))["admin_address"]
            base = f"http://{admin[0]}:{admin[1]}"
            async with session.get(base + "/readyz") as resp:
                assert resp.status == 200
            async with session.get(base + "/metrics") as resp:
                text = await resp.text()
                assert f'dledger_is_leader{{group="g",node="{new_leader}"}} 1.0' in text
            async with session.get(base + "/status") as resp:
                assert (await resp.json())["raft"]["role"] == "leader"

    try:
        with LocalCluster(str(tmp_path), size=3, tick_ms=50,
                          program=(*BROKER, "--namesrv", ns, "--register-interval-s", "1")) as cluster:
            asyncio.run(run(cluster))
    finally:
        ns_proc.terminate()
        ns_proc.wait(timeout=10)


def test_brokers_register_again_at_once_with_a_restarted_namesrv(tmp_path: Path) -> None:
    """The registration interval is 30 s: only the registrar's probe can bring the routes back
    within the deadline after the NameServer restarts on the same port."""
    ns_proc, ns = _start_namesrv(tmp_path)
    procs = [ns_proc]

    async def routed(session: aiohttp.ClientSession) -> bool:
        try:
            async with session.get(f"http://{ns}/v1/topics/back/route") as resp:
                if resp.status != 200:
                    return False
                groups = (await resp.json())["groups"]
                return len(groups) == 1 and groups[0]["leader"] is not None \
                    and len(groups[0]["nodes"]) == 3
        except aiohttp.ClientError:
            return False

    async def run(cluster: LocalCluster) -> float:
        async with LogClient(cluster.client_addresses, timeout_s=5.0) as client, \
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            await _wait_leader(client, cluster)
            await send(client, "back", 0, msg(b"x"))
            # registered just now (the topic is new): the next periodic round is ~30 s away
            await wait_until(lambda: routed(session), 15, "the first route")
            ns_proc.terminate()
            ns_proc.wait(timeout=10)
            restarted, _ = _start_namesrv(tmp_path, ns)
            procs.append(restarted)
            t0 = asyncio.get_running_loop().time()
            await wait_until(lambda: routed(session), 8, "the route from the new NameServer")
            return asyncio.get_running_loop().time() - t0

    try:
        with LocalCluster(str(tmp_path), size=3, tick_ms=50,
                          program=(*BROKER, "--namesrv", ns,
                                   "--register-interval-s", "30")) as cluster:
            took_s = asyncio.run(run(cluster))
        assert took_s < 8
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


def test_bad_input_gets_named_errors_and_the_broker_keeps_serving(tmp_path: Path) -> None:
    import socket
    import struct

    async def run(cluster: LocalCluster) -> None:
        async with LogClient(cluster.client_addresses, timeout_s=5.0) as client:
            leader = await _wait_leader(client, cluster)
            with pytest.raises(RemoteError) as err:  # auto-create is off here
                await send(client, "nosuch", 0, msg(b"x"))
            assert err.value.code == "TOPIC_NOT_FOUND"
            with pytest.raises(RemoteError) as err:
                await send(client, "nosuch", 0, msg(b"x" * (bp.MAX_MESSAGE_BYTES + 1)))
            assert err.value.code == "MESSAGE_TOO_LARGE"
            with pytest.raises(DLedgerError):  # malformed arguments: a named error, no hang
                await client.call(leader, bp.SEND, "t", "not a queue id", "not a list")
            host, port = cluster.servers[leader].client_address
            with socket.create_connection((host, port), timeout=5) as s:  # garbage, then oversize
                s.sendall(struct.pack(">I", 5) + b"\xff\xfe\xfd\xfc\xfb")
                s.sendall(struct.pack(">I", 1 << 30))
                s.settimeout(5)
                while s.recv(65536):
                    pass  # the server answers the garbage frame, then closes the connection
            _, status = await client.call_leader(bp.TOPIC_PUT, "made", 4, 4, 6)
            assert status == "OK"  # and it keeps serving
            assert (await send(client, "made", 0, msg(b"ok")))[0] == "SEND_OK"

    with LocalCluster(str(tmp_path), size=3, tick_ms=50,
                      program=(*BROKER, "--no-auto-create")) as cluster:
        asyncio.run(run(cluster))
