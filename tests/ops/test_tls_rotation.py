"""Certificate rotation and peer identity on real processes (docs/tls.md):

- a TLS NameServer and a 3-node broker group with mutual TLS between peers, a producer sending
  all along: every node's and the NameServer's certificate replaced on disk and SIGHUP sent to
  each PID, first by certificates of the same CA with new serials, then (through a CA bundle)
  by certificates of a new CA; fresh connections to every listener see the new certificate, a
  follower restarted with the new files rejoins over new peer links, a bad key on SIGHUP leaves
  its node serving its old certificate, and every acknowledged send is consumed at the end;
- ``--peer-mtls``: a log node started with a certificate of the cluster's CA that names another
  node cannot join (its peers refuse its connections and it refuses theirs); restarted with its
  own certificate, it joins.

Processes are signalled and stopped by their PIDs; every wait is on a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from client import ClientError, Message, Producer, PullConsumer
from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from dledger.network.tls_certs import NodeCert, make_ca, make_node_cert
from dledger.network.tls_reload import read_certificate
from protocol import broker_kinds as bp
from protocol.errors import DLedgerError
from protocol.tls import client_context
from tests.broker.test_broker_processes import BROKER
from tests.nodes.test_processes import wait_until

HOST = "127.0.0.1"
TOPIC = "rotation"
NODES = ("n0", "n1", "n2")


def _arun(coro: Awaitable[Any], timeout_s: float = 240.0) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(coro, timeout_s)
    return asyncio.run(bounded())


class Pki:
    """The cluster's certificate files at fixed paths (what the processes were started with),
    and new ones written over them the way an operator rotates: into a staging folder, then
    renamed into place (so a SIGHUP never reads half a file)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.ca_dir = str(base / "ca-old")
        self.old_ca = make_ca(self.ca_dir)
        self.ca_file = str(base / "cluster-ca.pem")  # every process's --tls-ca
        Path(self.ca_file).write_bytes(Path(self.old_ca).read_bytes())
        self.live = {name: self._sign(self.ca_dir, name, str(base / "live"))
                     for name in ("namesrv", *NODES)}
        self._round = 0

    @staticmethod
    def _nodes(name: str) -> list[tuple[str, str]]:
        return [("a", name)] if name in NODES else []

    def _sign(self, ca_dir: str, name: str, out_dir: str) -> NodeCert:
        return make_node_cert(ca_dir, name, out_dir=out_dir, nodes=self._nodes(name))

    def args(self, name: str) -> tuple[str, ...]:
        cert = self.live[name]
        return ("--tls-cert", cert.cert_file, "--tls-key", cert.key_file, "--tls-ca", self.ca_file)

    def rotate(self, ca_dir: str) -> dict[str, str]:
        """New certificates (new keys, new serials) signed by ``ca_dir``'s CA for every
        process, renamed into place; their serials by name."""
        self._round += 1
        stage = str(self.base / f"stage{self._round}")
        serials = {}
        for name, live in self.live.items():
            new = self._sign(ca_dir, name, stage)
            os.replace(new.key_file, live.key_file)
            os.replace(new.cert_file, live.cert_file)
            serials[name] = read_certificate(live.cert_file).serial
        return serials

    def set_ca(self, *ca_files: str) -> None:
        tmp = self.ca_file + ".new"
        Path(tmp).write_bytes(b"".join(Path(f).read_bytes() for f in ca_files))
        os.replace(tmp, self.ca_file)


async def _presented(addr: tuple[str, int], ca: str, cert: NodeCert | None = None,
                     alpn: str | None = None) -> str:
    """The serial of the certificate a fresh TLS connection to ``addr`` is shown (verified
    against ``ca``; ``cert``: presented as the client's, for a peer port; ``alpn``: the
    protocol offered, ``h2`` for the gRPC listener, which takes no handshake without it)."""
    ctx = client_context(ca, cert.cert_file, cert.key_file) if cert else client_context(ca)
    if alpn is not None:
        ctx.set_alpn_protocols([alpn])
    _, writer = await asyncio.open_connection(*addr, ssl=ctx, server_hostname=addr[0])
    try:
        return str(writer.get_extra_info("peercert")["serialNumber"])
    finally:
        writer.close()


async def _peer_keeps(addr: tuple[str, int], ca: str, cert: NodeCert) -> bool:
    """Whether a peer listener keeps a connection presenting ``cert`` (it says nothing on a peer
    link: a read that times out); False when it closes it (its CA does not take ``cert``). The
    window is long enough for a loaded machine's refusal: only the "kept" answers wait it out."""
    ctx = client_context(ca, cert.cert_file, cert.key_file)
    reader, writer = await asyncio.open_connection(*addr, ssl=ctx, server_hostname=addr[0])
    try:
        async with asyncio.timeout(3.0):
            await reader.read()
        return False
    except TimeoutError:
        return True
    except (ssl.SSLError, ConnectionResetError):
        return False
    finally:
        writer.close()


def _start_namesrv(base: Path, tls_args: tuple[str, ...]) -> tuple[subprocess.Popen[str], str]:
    err = open(base / "namesrv.log", "ab")  # noqa: SIM115 - the child's until it exits
    try:
        proc = subprocess.Popen([sys.executable, "-m", "namesrv", "--listen", f"{HOST}:0",
                                 "--log-level", "WARNING", *tls_args],
                                stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                text=True)
    finally:
        err.close()
    assert proc.stdout is not None
    host, port = json.loads(proc.stdout.readline())["listen"]
    return proc, f"{host}:{port}"


class Load:
    """A producer sending one message at a time until told to stop: what was acknowledged
    (the send returned: committed) and what failed (outcome unknown or refused)."""

    def __init__(self, ns: str, ca: str) -> None:
        self.ns, self.ca = ns, ca
        self.acked: list[bytes] = []
        self.failed: list[str] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        async with Producer(self.ns, tls_ca=self.ca) as p:
            i = 0
            while not self.stop.is_set():
                body = f"m{i}".encode()
                i += 1
                try:
                    await p.send(Message(TOPIC, body))
                    self.acked.append(body)
                except ClientError as err:  # (counted: only acknowledged sends must survive)
                    self.failed.append(f"{body!r}: {type(err).__name__}: {err}")

    async def more(self, n: int, what: str) -> None:
        """Wait until ``n`` more sends are acknowledged."""
        target = len(self.acked) + n
        await wait_until(lambda: len(self.acked) >= target, 60, f"{n} more acknowledged {what}")


async def _consumed(ns: str, ca: str) -> set[bytes]:
    got: set[bytes] = set()
    async with PullConsumer(ns, "rotation-check", tls_ca=ca) as c:
        for mq in await c.fetch_queues(TOPIC):
            offset = 0
            for _ in range(10_000):  # bounded: far more pulls than the messages need
                r = await c.pull(mq, offset, max_messages=256)
                got.update(m.body for m in r.messages)
                if r.next_offset == offset or r.next_offset >= r.max_offset:
                    break
                offset = r.next_offset
    return got


async def _roles(cluster: LocalCluster, ca: str) -> dict[str, dict[str, Any]]:
    out = {}
    async with LogClient(cluster.client_addresses, timeout_s=3.0,
                         ssl_context=client_context(ca)) as lc:
        for nid in cluster.servers:
            try:
                out[nid] = (await lc.call(nid, bp.BROKER_STATUS))["raft"]
            except DLedgerError:
                continue
    return out


def _log(cluster: LocalCluster, nid: str) -> str:
    return cluster.log_of_last_start(nid, max_bytes=1 << 20)


@pytest.mark.slow
def test_certificates_rotate_under_load_without_losing_an_acknowledged_send(
        tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    new_ca_dir = str(tmp_path / "pki" / "ca-new")
    new_ca = make_ca(new_ca_dir)
    client_ca = str(tmp_path / "client-ca.pem")  # the clients trust both CAs from the start
    Path(client_ca).write_bytes(Path(pki.old_ca).read_bytes() + Path(new_ca).read_bytes())
    ns_proc, ns = _start_namesrv(tmp_path, pki.args("namesrv"))
    ns_addr = (HOST, int(ns.rsplit(":", 1)[1]))
    try:
        with LocalCluster(str(tmp_path / "a"), size=3, tick_ms=50, group="a",
                          program=(*BROKER, "--namesrv", ns, "--register-interval-s", "1"),
                          node_args={n: (*pki.args(n), "--peer-mtls", "--remoting-listen",
                                         f"{HOST}:0", "--grpc-listen", f"{HOST}:0")
                                     for n in NODES}) as cluster:
            _arun(_rotate_under_load(cluster, pki, ns, ns_addr, ns_proc.pid, new_ca_dir,
                                     new_ca, client_ca))
    finally:
        ns_proc.terminate()
        ns_proc.wait(timeout=10)
    ns_log = (tmp_path / "namesrv.log").read_text()
    assert ns_log.count("TLS reloaded") == 4, ns_log[-3000:]
    for failure in ("certificate verify failed", "TLS handshake failed", "Traceback"):
        assert failure not in ns_log, ns_log[-3000:]


def _listeners(cluster: LocalCluster, nid: str) -> dict[str, tuple[str, int]]:
    s = cluster.servers[nid]
    admin, remoting, grpc = s.ready["admin"], s.ready["remoting"], s.ready["grpc"]
    return {"client": s.client_address, "peer": s.peer_address,
            "admin": (admin[0], admin[1]), "remoting": (remoting[0], remoting[1]),
            "grpc": (grpc[0], grpc[1])}


async def _all_present(cluster: LocalCluster, ns_addr: tuple[str, int], ca: str,
                       peer_cert: NodeCert, want: dict[str, str]) -> dict[str, str]:
    """Which listener shows which serial on a fresh connection (verified against ``ca``)."""
    seen = {"namesrv": await _presented(ns_addr, ca)}
    for nid in NODES:
        for kind, addr in _listeners(cluster, nid).items():
            seen[f"{nid}/{kind}"] = await _presented(addr, ca,
                                                     peer_cert if kind == "peer" else None,
                                                     "h2" if kind == "grpc" else None)
    return {k: v for k, v in seen.items() if v != want[k.split("/")[0]]}


def _hup(cluster: LocalCluster, ns_pid: int) -> None:
    """SIGHUP to the NameServer and every broker, by PID (a restarted node has a new one)."""
    for pid in (ns_pid, *(cluster.servers[n].pid for n in NODES)):
        assert pid is not None
        os.kill(pid, signal.SIGHUP)


async def _rotate_under_load(cluster: LocalCluster, pki: Pki, ns: str,
                             ns_addr: tuple[str, int], ns_pid: int, new_ca_dir: str,
                             new_ca: str, client_ca: str) -> None:
    old = {name: read_certificate(c.cert_file).serial for name, c in pki.live.items()}
    probe = make_node_cert(pki.ca_dir, "probe", out_dir=str(pki.base / "probe"))
    load = Load(ns, client_ca)
    task = asyncio.create_task(load.run())
    try:
        await load.more(20, "before the rotation")
        leader_before = {n for n, r in (await _roles(cluster, client_ca)).items()
                         if r["role"] == "leader"}
        assert await _all_present(cluster, ns_addr, pki.old_ca, probe, old) == {}

        # 1. Same CA, new serials. Control: written but not signalled, nothing changes.
        new = pki.rotate(pki.ca_dir)
        assert await _all_present(cluster, ns_addr, pki.old_ca, probe, old) == {}
        _hup(cluster, ns_pid)

        async def shows(ca: str, want: dict[str, str], cert: NodeCert) -> bool:
            return await _all_present(cluster, ns_addr, ca, cert, want) == {}
        await wait_until(lambda: shows(pki.old_ca, new, probe), 30, "the new serials")
        await load.more(20, "after the first rotation")

        # 2. A new CA: first the bundle (old + new) everywhere, then certificates of the new CA.
        pki.set_ca(pki.old_ca, new_ca)
        _hup(cluster, ns_pid)
        await wait_until(lambda: all(_log(cluster, n).count("TLS reloaded") >= 2 for n in NODES),
                         30, "every node to reload the bundle")
        newer = pki.rotate(new_ca_dir)
        _hup(cluster, ns_pid)
        new_probe = make_node_cert(new_ca_dir, "probe", out_dir=str(pki.base / "probe-new"))
        await wait_until(lambda: shows(new_ca, newer, new_probe), 30, "the new CA's certificates")
        await load.more(20, "after the new CA")
        peer_port = _listeners(cluster, NODES[1])["peer"]
        assert await _peer_keeps(peer_port, client_ca, probe)  # the bundle: both CAs taken

        # A follower restarted on the new files rejoins: every peer link of it is new, both
        # ways, and authenticated with the new CA's certificates.
        roles = await _roles(cluster, client_ca)
        follower = next(n for n, r in roles.items() if r["role"] == "follower")
        cluster.kill(follower, signal.SIGTERM)
        await asyncio.to_thread(cluster.restart, follower)
        await load.more(20, "with the follower restarted")

        async def caught_up() -> bool:
            now = await _roles(cluster, client_ca)
            lead = [r for r in now.values() if r["role"] == "leader"]
            return bool(lead) and follower in now \
                and now[follower]["commit_index"] >= lead[0]["commit_index"] - 5 \
                and now[follower]["leader_id"] == lead[0]["node_id"]
        await wait_until(caught_up, 60, f"{follower} to rejoin over new peer links")

        # 3. The old CA dropped: the listeners that check client certificates refuse it now.
        pki.set_ca(new_ca)
        _hup(cluster, ns_pid)
        await wait_until(lambda: all(_log(cluster, n).count("TLS reloaded")
                                     >= (1 if n == follower else 4) for n in NODES), 30,
                         "the last reload (the restarted follower's first)")
        await load.more(20, "with the new CA alone")
        assert not await _peer_keeps(peer_port, client_ca, probe)  # the old CA: refused now
        assert await _peer_keeps(peer_port, client_ca, new_probe)

        # 4. A bad key on SIGHUP: refused by name, the node keeps serving its certificate.
        victim = NODES[0]
        key = pki.live[victim].key_file
        good_key = Path(key).read_bytes()
        Path(key).write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
        before = _log(cluster, victim).count("TLS reload refused")
        victim_pid = cluster.servers[victim].pid
        assert victim_pid is not None
        os.kill(victim_pid, signal.SIGHUP)
        await wait_until(lambda: _log(cluster, victim).count("TLS reload refused") > before, 30,
                         "the refusal")
        assert "TLS reload refused, TlsConfigError" in _log(cluster, victim)
        assert cluster.servers[victim].running
        assert await _presented(_listeners(cluster, victim)["client"], new_ca) == newer[victim]
        Path(key).write_bytes(good_key)
        await load.more(20, "after the refused reload")
    finally:
        load.stop.set()
        await task
    roles = await _roles(cluster, client_ca)
    leaders = [n for n, r in roles.items() if r["role"] == "leader"]
    assert len(leaders) == 1, roles
    consumed = await _consumed(ns, client_ca)
    lost = [b for b in load.acked if b not in consumed]
    assert lost == [], f"{len(lost)} acknowledged sends lost: {lost[:10]}"
    assert len(load.acked) >= 140
    # (reported: the leader before and after, and the sends whose outcome the client did not
    # learn, which may or may not be stored)
    print(f"acknowledged {len(load.acked)}, failed {len(load.failed)} {load.failed[:5]}; "
          f"leader before {sorted(leader_before)}, after {leaders}")
    assert set(old.values()).isdisjoint(newer.values()) and new != newer
    for nid in NODES:  # no handshake between members failed at any step of the rotation
        whole = Path(cluster.servers[nid].log_path).read_text()
        for failure in ("certificate verify failed", "TLS handshake failed", "TLS to ",
                        "Traceback"):
            assert failure not in whole, f"{nid}: {failure}\n{whole[-3000:]}"


# -- --peer-mtls: a certificate must name its node ---------------------------------------------


@pytest.mark.slow
def test_a_node_with_another_nodes_certificate_cannot_join(tmp_path: Path) -> None:
    ca_dir = str(tmp_path / "pki")
    ca = make_ca(ca_dir)
    certs = {n: make_node_cert(ca_dir, f"a-{n}", nodes=[("a", n)]) for n in NODES}
    certs["n2"], own = certs["n1"], certs["n2"]  # n2 starts with n1's certificate (and key)

    def args(n: str) -> tuple[str, ...]:
        return ("--tls-cert", certs[n].cert_file, "--tls-key", certs[n].key_file,
                "--tls-ca", ca, "--peer-mtls")

    with LocalCluster(str(tmp_path / "g"), size=3, tick_ms=50, group="a",
                      node_args={n: args(n) for n in NODES}) as cluster:
        async def main() -> None:
            async with LogClient(cluster.client_addresses, timeout_s=3.0,
                                 ssl_context=client_context(ca)) as lc:
                await lc.propose(b"without n2", timeout_s=30)
                for nid in ("n0", "n1"):
                    await wait_until(lambda n=nid: "it says it is 'n2'" in _log(cluster, n)
                                     and "refusing n2" in _log(cluster, n), 30,
                                     f"{nid} to refuse n2 both ways")
                stranded = (await lc.status("n2"))["raft"]
                assert stranded["leader_id"] is None and stranded["commit_index"] == 0, stranded
                # Negative control: n2 restarted with its own certificate joins.
                cluster.kill("n2", signal.SIGTERM)
                certs["n2"] = own
                cluster.node_args["n2"] = args("n2")
                await asyncio.to_thread(cluster.restart, "n2")
                _, committed = await lc.propose(b"with n2", timeout_s=30)

                async def joined() -> bool:
                    st = (await lc.status("n2"))["raft"]
                    return st["leader_id"] is not None and st["commit_index"] >= committed.index
                await wait_until(joined, 30, "n2 to join with its own certificate")
        _arun(main())
        for nid in ("n0", "n1"):
            line = next(x for x in _log(cluster, nid).splitlines() if "it says it is 'n2'" in x)
            assert "PeerIdentityError" in line and "names dledger-node:a/n1, not dledger-node:a/n2" \
                in line, line
        # (and n2 was told at its first start: the whole log file holds both starts)
        assert "does not name it as dledger-node:a/n2" in \
            Path(cluster.servers["n2"].log_path).read_text()
