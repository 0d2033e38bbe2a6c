"""Who may register with a NameServer: the cluster credential (``protocol.cluster_key``) and the
NameServer's check (``namesrv.registration_auth``).

Pure: signatures, the clock window, replays, the credential's file. Over HTTP, an in-process
NameServer with a credential: unsigned, wrongly signed, replayed and borrowed-identity
registrations and unregistrations are refused (401 / 403) and change nothing, each beside the
same request signed right, which passes. Live: against ``dledger up`` with no option, an
unsigned leader claim at the group's term + 1 and a spoofed unregister of the leader change
nothing while a producer keeps sending; the same claim signed is taken for liveness and waits
for a member of the group to confirm it (``namesrv.registry``), which none does."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from client import Message, Producer
from namesrv.server import NameServer
from protocol.cluster_key import (
    CLUSTER_KEY_ENV,
    KEY_FILE_ENV,
    BadClusterSignatureError,
    ClusterKeyError,
    NonceCache,
    ReplayedRequestError,
    UnsignedRequestError,
    generate_key_file,
    load_cluster_key,
    sign_headers,
    verify,
)
from tests.cli.up_process import UpProcess
from tests.nodes.test_processes import wait_until

KEY = b"k" * 40
OTHER_KEY = b"o" * 40
REGISTER = "/v1/brokers/register"
UNREGISTER = "/v1/brokers/unregister"
NOW_MS = 1_800_000_000_000


# -- pure: signatures and the credential -------------------------------------------------------

def test_a_signature_checks_and_names_its_signer() -> None:
    headers = sign_headers(KEY, "POST", REGISTER, "a/n0", b"{}", NOW_MS)
    signer = verify(KEY, headers, "POST", REGISTER, b"{}", NOW_MS + 500, NonceCache())
    assert (signer.group, signer.node_id) == ("a", "n0")


@pytest.mark.parametrize("change", ["body", "path", "key", "node", "time", "signature"])
def test_anything_altered_fails_the_signature(change: str) -> None:
    headers = sign_headers(KEY, "POST", REGISTER, "a/n0", b'{"term":7}', NOW_MS)
    body, path, key = b'{"term":7}', REGISTER, KEY
    if change == "body":
        body = b'{"term":8}'
    elif change == "path":
        path = UNREGISTER
    elif change == "key":
        key = OTHER_KEY
    elif change in ("node", "time"):
        headers = {**headers, **({"X-DLedger-Node": "a/n1"} if change == "node"
                                 else {"X-DLedger-Time": str(NOW_MS + 1)})}
    else:
        headers = {**headers, "X-DLedger-Signature": "0" * 64}
    with pytest.raises(BadClusterSignatureError, match="does not check"):
        verify(key, headers, "POST", path, body, NOW_MS, NonceCache())


def test_a_replay_within_the_window_and_a_clock_outside_it_are_refused() -> None:
    nonces = NonceCache(window_ms=60_000)
    headers = sign_headers(KEY, "POST", REGISTER, "a/n0", b"{}", NOW_MS)
    verify(KEY, headers, "POST", REGISTER, b"{}", NOW_MS, nonces)
    with pytest.raises(ReplayedRequestError, match="seen before"):
        verify(KEY, headers, "POST", REGISTER, b"{}", NOW_MS + 30_000, nonces)
    with pytest.raises(BadClusterSignatureError, match="outside the 60000 ms window"):
        verify(KEY, headers, "POST", REGISTER, b"{}", NOW_MS + 60_001, nonces)
    late = sign_headers(KEY, "POST", REGISTER, "a/n0", b"{}", NOW_MS - 61_000)
    with pytest.raises(BadClusterSignatureError, match="outside"):
        verify(KEY, late, "POST", REGISTER, b"{}", NOW_MS, nonces)
    fresh = sign_headers(KEY, "POST", REGISTER, "a/n0", b"{}", NOW_MS + 120_000)
    verify(KEY, fresh, "POST", REGISTER, b"{}", NOW_MS + 120_000, nonces)
    assert len(nonces) == 1  # the first one forgotten once no clock could pass it again


def test_the_nonce_cache_is_bounded_and_refuses_rather_than_forgets() -> None:
    nonces = NonceCache(window_ms=1000, nonces_max=2)
    nonces.admit("a" * 16, NOW_MS, NOW_MS)
    nonces.admit("b" * 16, NOW_MS, NOW_MS)
    with pytest.raises(BadClusterSignatureError, match="2 signed requests within the window"):
        nonces.admit("c" * 16, NOW_MS, NOW_MS)
    nonces.admit("c" * 16, NOW_MS + 1001, NOW_MS + 1001)  # the others expired meanwhile


def test_unsigned_and_malformed_headers_are_named() -> None:
    with pytest.raises(UnsignedRequestError, match="must be signed"):
        verify(KEY, {}, "POST", REGISTER, b"{}", NOW_MS, NonceCache())
    bad = {**sign_headers(KEY, "POST", REGISTER, "a/n0", b"{}", NOW_MS), "X-DLedger-Node": "a"}
    with pytest.raises(BadClusterSignatureError, match="malformed"):
        verify(KEY, bad, "POST", REGISTER, b"{}", NOW_MS, NonceCache())


def test_the_credential_comes_from_a_private_file_or_the_environment(tmp_path: Path) -> None:
    path = str(tmp_path / "cluster.key")
    key = generate_key_file(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and len(key) == 64
    assert generate_key_file(path) == key  # made once, then read
    assert load_cluster_key(path, {CLUSTER_KEY_ENV: "e" * 40}) == key  # the file first
    assert load_cluster_key(None, {KEY_FILE_ENV: path}) == key
    assert load_cluster_key(None, {CLUSTER_KEY_ENV: " " + "e" * 40 + "\n"}) == b"e" * 40
    assert load_cluster_key(None, {}) is None
    os.chmod(path, 0o644)
    with pytest.raises(ClusterKeyError, match="readable by others"):
        load_cluster_key(path, {})
    with pytest.raises(ClusterKeyError, match="needs 32"):
        load_cluster_key(None, {CLUSTER_KEY_ENV: "short"})
    with pytest.raises(ClusterKeyError, match="cannot read"):
        load_cluster_key(str(tmp_path / "missing"), {})


# -- over HTTP: an in-process NameServer -------------------------------------------------------

def _claim(node: str = "n0", term: int = 7, role: str = "leader") -> dict[str, Any]:
    return {"group": "a", "node_id": node, "client_address": "127.0.0.1:10911",
            "admin_address": "127.0.0.1:10921", "role": role, "term": term,
            "topics": {"orders": {"read_queues": 4, "write_queues": 4, "perm": 6}}}


async def _post(http: aiohttp.ClientSession, base: str, path: str, body: dict[str, Any],
                key: bytes | None = None, signer: str | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    raw = json.dumps(body).encode()
    if headers is None:
        headers = {} if key is None else sign_headers(
            key, "POST", path, signer or f"{body['group']}/{body['node_id']}", raw,
            int(time.time() * 1000))
    async with http.post(base + path, data=raw, headers=headers) as resp:
        return resp.status, await resp.json()


def _serve(scenario: Any, key: bytes | None, insecure: bool = False) -> None:
    async def main() -> None:
        server = NameServer("127.0.0.1", 0, cluster_key=key, insecure=insecure)
        await server.start()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
                await scenario(http, server.url)
        finally:
            await server.stop()
    asyncio.run(main())


async def _leader(http: aiohttp.ClientSession, base: str) -> tuple[str | None, int, list[str]]:
    async with http.get(base + "/v1/cluster") as resp:
        groups = (await resp.json())["groups"]
    if not groups:
        return None, 0, []
    g = groups[0]
    return g["leader"], g["term"], [n["node_id"] for n in g["nodes"]]


def test_only_a_registration_signed_for_its_own_node_changes_the_routes() -> None:
    async def scenario(http: aiohttp.ClientSession, base: str) -> None:
        assert (await _post(http, base, REGISTER, _claim(), KEY))[0] == 200
        forged = _claim("n9", term=8)
        status, body = await _post(http, base, REGISTER, forged)
        assert status == 401 and "must be signed" in body["error"]
        status, body = await _post(http, base, REGISTER, forged, OTHER_KEY)
        assert status == 403 and "does not check" in body["error"]
        status, body = await _post(http, base, REGISTER, forged, KEY, signer="a/n0")
        assert status == 403 and "signs for itself only" in body["error"]
        raw = json.dumps(forged).encode()
        replayed = sign_headers(KEY, "POST", REGISTER, "a/n9", raw,
                                int(time.time() * 1000))
        async with http.post(base + REGISTER, data=raw, headers=replayed) as resp:
            assert resp.status == 200  # the negative control: signed right, it passes
            assert (await resp.json())["pending"] is True  # (no member confirms n9 leads)
        assert await _leader(http, base) == ("n0", 7, ["n0", "n9"])
        status, body = await _post(http, base, REGISTER, forged, headers=replayed)
        assert status == 403 and "replayed" in body["error"]
        spoof = {"group": "a", "node_id": "n0", "term": 7}
        assert (await _post(http, base, UNREGISTER, spoof))[0] == 401
        assert (await _post(http, base, UNREGISTER, spoof, OTHER_KEY))[0] == 403
        assert (await _post(http, base, UNREGISTER, spoof, KEY, signer="a/n9"))[0] == 403
        assert await _leader(http, base) == ("n0", 7, ["n0", "n9"])  # nothing changed
        assert (await _post(http, base, UNREGISTER, spoof, KEY))[1]["removed"] is True
        assert await _leader(http, base) == (None, 7, ["n9"])
    _serve(scenario, KEY)


def test_without_a_credential_nothing_registers_unless_insecure() -> None:
    async def refusing(http: aiohttp.ClientSession, base: str) -> None:
        status, body = await _post(http, base, REGISTER, _claim(), KEY)
        assert status == 401 and "no cluster credential" in body["error"]
        async with http.get(base + "/readyz") as resp:
            assert (await resp.json())["registrations"] == "refusing"
        assert await _leader(http, base) == (None, 0, [])
    _serve(refusing, None)

    async def insecure(http: aiohttp.ClientSession, base: str) -> None:
        assert (await _post(http, base, REGISTER, _claim()))[0] == 200  # unsigned: taken
        status, _ = await _post(http, base, REGISTER, _claim("n1", 8), OTHER_KEY)
        assert status == 403  # a signature that fails is still refused
        async with http.get(base + "/readyz") as resp:
            assert (await resp.json())["registrations"] == "insecure"
        assert await _leader(http, base) == ("n0", 7, ["n0"])
    _serve(insecure, KEY, insecure=True)


# -- live: dledger up with no option ----------------------------------------------------------

@pytest.mark.slow
def test_against_dledger_up_an_unsigned_leader_claim_and_unregister_change_nothing(
        tmp_path: Path) -> None:
    data_dir = tmp_path / "d"
    up = UpProcess(data_dir).ready()
    try:
        key_file = data_dir / "cluster.key"
        assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
        asyncio.run(_attack_while_producing(up.namesrv, key_file.read_text().strip().encode()))
    finally:
        up.cleanup()


async def _attack_while_producing(ns: str, key: bytes) -> None:
    base = f"http://{ns}"
    acked: list[int] = []
    failed: list[str] = []
    stop = asyncio.Event()

    async def produce() -> None:
        async with Producer(ns) as p:
            while not stop.is_set():
                try:
                    await p.send(Message("auth-orders", b"m%d" % len(acked)))
                    acked.append(1)
                except Exception as err:  # every failure is counted: none may happen
                    failed.append(repr(err))

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        async def routed() -> bool:
            leader, _, nodes = await _leader(http, base)
            return leader is not None and len(nodes) == 3
        await wait_until(routed, 60, "dledger up's group routed with its three nodes")
        leader, term, nodes = await _leader(http, base)
        producer = asyncio.create_task(produce())
        try:
            await wait_until(lambda: len(acked) >= 20, 60, "the producer's first sends")
            forged = {**_claim("evil", term + 1), "client_address": "127.0.0.1:1",
                      "admin_address": "127.0.0.1:2", "topics": {}}
            status, _ = await _post(http, base, REGISTER, forged)
            assert status == 401
            assert (await _post(http, base, REGISTER, forged, OTHER_KEY))[0] == 403
            spoof = {"group": "a", "node_id": leader, "term": term}
            assert (await _post(http, base, UNREGISTER, spoof))[0] == 401
            before = len(acked)
            await wait_until(lambda: len(acked) >= before + 50, 60,
                             "the producer's sends after the forgeries")
        finally:
            stop.set()
            await producer
        assert failed == [], failed[:3]
        assert await _leader(http, base) == (leader, term, nodes)
        # the negative control: the same claim signed with the cluster's credential passes the
        # signature, and then waits for a member of the group to confirm it: none does
        status, answer = await _post(http, base, REGISTER, forged, key)
        assert (status, answer["pending"], answer["leader"]) == (200, True, leader)
        assert await _leader(http, base) == (leader, term, nodes)  # (not a member: not shown)
