"""Access control on a real group (``--acl``): each way a request can be refused is refused by
name and stores nothing (unsigned, a wrong secret, a stale clock, a replay, a send without PUB,
a pull without SUB, an admin request by a non-admin); an authorised client works; ``dledger acl``
manages accounts; a fuzz of signed envelopes never takes a node down."""

from __future__ import annotations

import asyncio
import os
import random
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from broker.features.acl.model import PUB, SUB, Account
from client import (
    AccessDeniedError,
    Credentials,
    Message,
    Producer,
    PullConsumer,
    SignatureError,
)
from client.cluster.routes import GroupRoute, Routes
from dledger.localcluster import LocalCluster
from protocol import broker_kinds as bp
from protocol.auth import SIGNED, Signer
from protocol.envelope import Response, decode_response, encode_request
from protocol.frames import encode_frame, encode_payload
from tests.clusters import namesrv_group, registered_group

pytestmark = pytest.mark.slow

ROOT = Credentials("root", "root-secret-1")
ALICE = Credentials("alice", "alice-secret-1")  # PUB on orders, SUB on logs
ACL_ARGS = ("--acl", "--acl-admin-key", "root")


async def raw_call(addr: tuple[str, int], payload: bytes, timeout_s: float = 5.0) -> Response:
    """One frame to a node on a connection of its own, and its answer."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(*addr), timeout_s)
    try:
        writer.write(encode_frame(payload))
        await writer.drain()
        (size,) = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), timeout_s))
        return decode_response(await asyncio.wait_for(reader.readexactly(size), timeout_s))
    finally:
        writer.close()


async def leader_of(routes: Routes) -> tuple[GroupRoute, str]:
    g = await registered_group(routes)
    node, _ = await routes.group_client(g).call_leader(bp.BROKER_STATUS)
    status = (await routes.group_client(g).call(node, bp.BROKER_STATUS))
    return g, status["raft"]["leader_id"] or node


async def max_offset(routes: Routes, g: GroupRoute, topic: str) -> int:
    """Messages stored in ``topic`` (its queues' max offsets, through the leader, as root)."""
    total = 0
    _, status = await routes.group_client(g).call_leader(bp.BROKER_STATUS)
    queues = status["topics"].get(topic, {}).get("read_queues", 0)
    for q in range(queues):
        _, answer = await routes.group_client(g).call_leader(bp.PULL, topic, q, 0, 0, 0, 0, ["*"])
        total += answer[3]
    return total


def send_frame(signer: Signer | None, target: str, topic: str, rid: int = 1) -> bytes:
    inner = encode_request(bp.SEND, rid, topic, 0, [[b"raw", "", [], f"u-{rid}-{random.random()}",
                                                     [], int(time.time() * 1000)]])
    return inner if signer is None else signer.wrap(rid, target, inner)


def test_every_refusal_is_named_stores_nothing_and_an_authorised_client_works(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLEDGER_ACL_SECRET_ROOT", ROOT.secret_key)
    monkeypatch.setenv("DLEDGER_ACCESS_KEY", ROOT.access_key)  # the group's routing warm-up
    monkeypatch.setenv("DLEDGER_SECRET_KEY", ROOT.secret_key)
    with namesrv_group(tmp_path, *ACL_ARGS) as (ns, cluster):
        monkeypatch.delenv("DLEDGER_ACCESS_KEY")
        monkeypatch.delenv("DLEDGER_SECRET_KEY")
        asyncio.run(_refusals(ns, cluster))
        _cli(ns, tmp_path)
        # every refusal logged with its account, no secret anywhere in the brokers' logs
        logs = "".join(cluster.log_of_last_start(nid) for nid in cluster.servers)
        assert "request refused: account=alice" in logs and "account=root" not in logs
        pages = asyncio.run(_pages(ns, cluster))  # status, metrics, the console's pages
        for secret in (ROOT.secret_key, ALICE.secret_key, "bob-secret-1", "not-her-secret",
                       os.environ["DLEDGER_CLUSTER_KEY"]):
            assert secret not in logs and secret not in pages


async def _pages(ns: str, cluster: LocalCluster) -> str:
    """What anyone who reaches the HTTP ports reads: each node's /status and /metrics, the
    NameServer's cluster view, /readyz and its console (page, script, config)."""
    urls = [f"http://{a[0]}:{a[1]}{path}" for s in cluster.servers.values()
            if (a := s.ready.get("admin")) for path in ("/status", "/metrics")]
    urls += [f"http://{ns}{path}" for path in ("/v1/cluster", "/readyz", "/console",
                                               "/console/api/config",
                                               "/console/static/console.js")]
    texts = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        for url in urls:
            async with http.get(url) as resp:
                texts.append(await resp.text())
                assert resp.status == 200, (url, resp.status)
    return "\n".join(texts)


async def _refusals(ns: str, cluster: LocalCluster) -> None:
    async with Producer(ns, credentials=ROOT) as root:
        for topic in ("orders", "logs"):
            await root.send(Message(topic, b"seed"))
    routes = Routes(ns, credentials=ROOT)
    await routes.start()
    try:
        g, leader = await leader_of(routes)
        alice = Account(ALICE.access_key, ALICE.secret_key, topic_perms=(("logs", SUB),
                                                                         ("orders", PUB)))
        _, status = await routes.group_client(g).call_leader(bp.ACL_PUT, alice.row())
        assert status == "OK"
        before = {t: await max_offset(routes, g, t) for t in ("orders", "logs")}

        # an authorised client works: alice sends to orders, reads logs
        async with Producer(ns, credentials=ALICE) as p:
            assert (await p.send(Message("orders", b"ok"))).msg_id
            with pytest.raises(AccessDeniedError, match="PUB on topic 'logs'"):
                await p.send(Message("logs", b"no PUB"))
        async with PullConsumer(ns, "alice-readers", credentials=ALICE) as c:
            (mq, *_) = await c.fetch_queues("logs")
            await c.pull(mq, 0, 1)
            (omq, *_) = await c.fetch_queues("orders")
            with pytest.raises(AccessDeniedError, match="SUB on topic 'orders'"):
                await c.pull(omq, 0, 1)
        # unsigned, and a wrong secret, through the library
        async with Producer(ns, credentials=None) as p:
            with pytest.raises(SignatureError, match="must be signed"):
                await p.send(Message("orders", b"unsigned"))
        async with Producer(ns, credentials=Credentials("alice", "not-her-secret")) as p:
            with pytest.raises(SignatureError, match="does not match"):
                await p.send(Message("orders", b"wrong secret"))
        # an admin request by a non-admin
        alice_routes = Routes(ns, credentials=ALICE)
        await alice_routes.start()
        try:
            with pytest.raises(Exception) as denied:
                await alice_routes.group_client(g).call_leader(bp.TOPIC_PUT, "made-by-alice", 4, 4, 6)
            assert getattr(denied.value, "code", "") == "ACCESS_DENIED"
        finally:
            await alice_routes.close()

        # raw frames to the leader: unsigned, stale, replayed, for another node
        addr = cluster.servers[leader].client_address
        target = f"{g.group}/{leader}"  # what a signature names: the group and the node
        unsigned = await raw_call(addr, send_frame(None, target, "orders"))
        assert not unsigned.ok and unsigned.code == "SIGNATURE_REFUSED"
        stale = await raw_call(addr, send_frame(Signer(ALICE, clock_s=lambda: time.time() - 120),
                                                target, "orders"))
        assert not stale.ok and stale.code == "SIGNATURE_REFUSED" and "clock" in stale.message
        frame = send_frame(Signer(ALICE), target, "orders")
        first = await raw_call(addr, frame)
        assert first.ok, first
        replay = await raw_call(addr, frame)
        assert not replay.ok and replay.code == "SIGNATURE_REFUSED" and "replayed" in replay.message
        other = await raw_call(addr, send_frame(Signer(ALICE), f"{g.group}/n9", "orders"))
        assert not other.ok and "signed for" in other.message
        elsewhere = await raw_call(addr, send_frame(Signer(ALICE), f"b/{leader}", "orders"))
        assert not elsewhere.ok and "signed for" in elsewhere.message  # another group's node

        # nothing refused was stored: orders has alice's two accepted sends, logs nothing new,
        # and the topic alice asked for does not exist
        after = {t: await max_offset(routes, g, t) for t in ("orders", "logs")}
        assert after == {"orders": before["orders"] + 2, "logs": before["logs"]}
        # the broker's own topics are an admin's only, whatever the account's default
        alice_routes = Routes(ns, credentials=ALICE)
        await alice_routes.start()
        try:
            with pytest.raises(Exception) as system:
                await alice_routes.group_client(g).call(leader, bp.PULL, "SCHEDULE_TOPIC_XXXX", 0,
                                                        0, 1, 1 << 20, 0, ["*"])
            assert getattr(system.value, "code", "") == "ACCESS_DENIED", system.value
        finally:
            await alice_routes.close()
        _, status = await routes.group_client(g).call_leader(bp.BROKER_STATUS)
        assert "made-by-alice" not in status["topics"]

        await _fuzz(addr, target)
        # the node still serves, as before the fuzz
        async with Producer(ns, credentials=ALICE) as p:
            assert (await p.send(Message("orders", b"after the fuzz"))).msg_id
        assert cluster.servers[leader].running
    finally:
        await routes.close()


async def _fuzz(addr: tuple[str, int], target: str, rounds: int = 300) -> None:
    """Envelopes with each field mutated at random: every one answered with a named refusal."""
    rng = random.Random(21)
    signer = Signer(ALICE)
    junk: list[Any] = [None, True, -1, 0, 2**64, 1.5, "", "x" * 70, b"", b"\x00" * 16,
                       b"\xff" * 32, [], {}, [1, 2], "alice", target]
    for i in range(rounds):
        rid = i + 100
        valid = signer.wrap(rid, target, encode_request(bp.BROKER_STATUS, rid))
        fields = [rid, "alice", target, os.urandom(16), i + 1, int(time.time() * 1000),
                  os.urandom(32), encode_request(bp.BROKER_STATUS, rid)]
        for k in rng.sample(range(1, len(fields)), rng.randint(1, 3)):
            fields[k] = rng.choice(junk)
        payload = encode_payload(SIGNED, fields) if i % 10 else valid[: rng.randint(1, len(valid) - 1)]
        try:
            resp = await raw_call(addr, payload)
        except (asyncio.IncompleteReadError, ConnectionError):
            continue  # a truncated frame: the node may close that connection, nothing more
        assert not resp.ok and resp.code in ("SIGNATURE_REFUSED", "BAD_REQUEST", "ERROR"), resp


def _cli(ns: str, tmp_path: Path) -> None:
    """``dledger acl put|list|delete`` with credentials from the environment."""
    env = {**os.environ, "DLEDGER_ACCESS_KEY": "root", "DLEDGER_SECRET_KEY": ROOT.secret_key,
           "DLEDGER_ACL_NEW_SECRET": "bob-secret-1"}

    def dledger(*args: str, ok: bool = True) -> str:
        out = subprocess.run([sys.executable, "-m", "cli", *args], env=env, capture_output=True,
                             text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert (out.returncode == 0) == ok, out.stderr
        return out.stdout + out.stderr

    assert "account bob OK" in dledger("acl", "put", "bob", "--namesrv", ns,
                                       "--topic", "orders=PUB|SUB", "--default-group-perm", "DENY")
    listed = dledger("acl", "list", "--namesrv", ns)
    assert "bob" in listed and "topic:orders=PUB|SUB" in listed and "root" in listed
    assert "bob-secret-1" not in listed and ROOT.secret_key not in listed
    bob = {**env, "DLEDGER_ACCESS_KEY": "bob", "DLEDGER_SECRET_KEY": "bob-secret-1"}
    denied = subprocess.run([sys.executable, "-m", "cli", "acl", "list", "--namesrv", ns],
                            env=bob, capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert denied.returncode != 0 and "admin operation" in denied.stderr
    assert "deleted" in dledger("acl", "delete", "bob", "--namesrv", ns)
    assert "bob" not in dledger("acl", "list", "--namesrv", ns)
