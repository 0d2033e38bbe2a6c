"""A broker group on real processes, wired for faults: the fault proxy, the NameServer and N broker
nodes run as child processes, and every directed link goes through its own proxy.

- peer links: node ``a`` dials node ``b`` through proxy ``a-b`` (3 nodes: 6 proxies, 5 nodes: 20);
- client links: clients reach node ``a`` through proxy ``c-a`` (brokers advertise that address);
- registration links: node ``a`` registers with the NameServer through proxy ``a-ns``;
- with ``grpc``, each node's gRPC endpoint (RocketMQ 5 clients) on a fixed port, reached directly;
  with ``remoting``, each node's remoting endpoint (RocketMQ 4.x clients) likewise.

Owns process lifecycle and the fault primitives a nemesis uses: cut/heal links, whole or one
stream of them (a blackhole: bytes are swallowed, nothing is reset, until the heal resets the
connections), one-way silence of a node, latency with jitter, SIGKILL, SIGSTOP/SIGCONT, power
loss (SIGUSR1: the node discards unsynced bytes and dies), disk corruption of a stopped node,
NameServer down/up. Every call blocks (process starts, proxy HTTP API); the async runner calls
them from a worker thread. Everything started is stopped by ``stop()``.

With ``tls`` every listener speaks TLS and peer links are mutual TLS (docs/tls.md), through the
same proxies (they forward bytes): a test CA and one certificate per process are made under
the run's directory, and ``DLEDGER_TLS_CA`` names the CA while the cluster runs, so that the
client library in this process and in the processes it starts speaks TLS to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dledger.localcluster import Address, ClusterError, LocalCluster, free_ports
from protocol.cluster_key import KEY_FILE_NAME, generate_key_file
from protocol.tls import ENV_CA

if TYPE_CHECKING:  # imported where used: `dledger chaos run --help` needs no dev extra
    from chaos.toxiproxy.client import ToxiproxyClient

Link = tuple[str, str]  # (src, dst): a directed link; "c" as src is the clients, "ns" the NameServer
CUT_TOXICS = {"upstream": "cut_up", "downstream": "cut_down"}  # stream -> toxic name
BOTH = ("upstream", "downstream")


def _fmt(addr: Address) -> str:
    return f"{addr[0]}:{addr[1]}"


def _read_ready_line(proc: subprocess.Popen[bytes], deadline_s: float) -> bytes:
    """The first stdout line of a child that announces itself, within ``deadline_s``."""
    assert proc.stdout is not None
    deadline = time.monotonic() + deadline_s
    buf = b""
    while time.monotonic() < deadline and b"\n" not in buf:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
        elif proc.poll() is not None:
            break
    if b"\n" not in buf:
        raise ClusterError(f"{proc.args!r} did not announce itself in {deadline_s} s")
    return buf.split(b"\n", 1)[0]


def _stop_process(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGCONT)
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@dataclass
class ChaosCluster:
    base_dir: str
    size: int = 3
    flush_mode: str = "sync"
    tick_ms: int = 100
    election_ticks: int = 10
    canaries: tuple[str, ...] = ()
    async_flush_ms: int = 50
    seed: int = 0
    group: str = "g"
    broker_args: tuple[str, ...] = ()  # more broker options (delay levels, broker canaries)
    namesrv_args: tuple[str, ...] = ()  # more NameServer options (its canary)
    spares: int = 0  # nodes beyond the group's first members, started with --join when added
    grpc: bool = False  # each node serves RocketMQ 5 clients on a fixed port (grpc_addresses)
    grpc_addresses: dict[str, str] = field(default_factory=dict)  # node -> host:port, direct
    remoting: bool = False  # each node serves RocketMQ 4.x clients on a fixed port
    brokers: LocalCluster = field(init=False)
    members: set[str] = field(default_factory=set)  # the group as the schedule changed it
    proxies: dict[Link, Address] = field(default_factory=dict)  # link -> proxy listen address
    namesrv_port: int = 0
    tls: bool = False  # TLS everywhere, mutual TLS on peer links (see the module docstring)
    tls_ca: str | None = None  # the test CA, once made
    _env_ca: str | None = None  # DLEDGER_TLS_CA as it was before start()
    _namesrv_tls: tuple[str, ...] = ()  # the NameServer's TLS options
    key_file = ""  # the cluster credential the NameServer and the brokers share
    _toxi_proc: subprocess.Popen[bytes] | None = None
    _ns_proc: subprocess.Popen[bytes] | None = None
    toxi: ToxiproxyClient | None = None
    cut_links: dict[Link, tuple[str, ...]] = field(default_factory=dict)  # link -> streams cut
    slow_links: set[Link] = field(default_factory=set)

    @property
    def node_ids(self) -> list[str]:
        return list(self.brokers.servers)

    @property
    def namesrv_running(self) -> bool:
        return self._ns_proc is not None and self._ns_proc.poll() is None

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    @property
    def direct_client_addresses(self) -> dict[str, Address]:
        """Each node's own client port, bypassing the proxies (for the final drain)."""
        return self.brokers.client_addresses

    def active_ids(self) -> list[str]:
        """The group's members (the first nodes, as the schedule changed them)."""
        return [n for n in self.node_ids if n in self.members]

    def peer_links(self) -> list[Link]:
        return [(a, b) for a in self.node_ids for b in self.node_ids if a != b]

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> ChaosCluster:
        os.makedirs(self.base_dir, exist_ok=True)
        try:
            self._start_toxiproxy()
            tls_args = self._make_tls() if self.tls else {}
            self.key_file = os.path.join(self.base_dir, KEY_FILE_NAME)  # signs registrations
            generate_key_file(self.key_file)
            self.namesrv_port = free_ports(1)[0]
            self.start_namesrv()
            self.brokers = LocalCluster(
                os.path.join(self.base_dir, "brokers"), size=self.size + self.spares,
                initial=self.size if self.spares else None, group=self.group,
                flush_mode=self.flush_mode, tick_ms=self.tick_ms,
                election_ticks=self.election_ticks, trace=True, start_timeout_s=30.0,
                program=("-m", "broker", "start"),
                extra_args=("--test-faults", "--register-interval-s", "2",
                            "--cluster-key-file", self.key_file,
                            "--checkpoint-interval-s", "5", "--async-flush-ms",
                            str(self.async_flush_ms),
                            *(a for c in self.canaries for a in ("--canary", c)),
                            *tls_args.get("broker", ()), *self.broker_args))
            self._create_proxies()
            self.members = set(self.brokers.members())
            self.brokers.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if getattr(self, "brokers", None) is not None:
            self.brokers.stop()
        _stop_process(self._ns_proc)
        _stop_process(self._toxi_proc)
        if self.tls_ca is not None and os.environ.get(ENV_CA) == self.tls_ca:
            if self._env_ca is None:
                os.environ.pop(ENV_CA, None)
            else:
                os.environ[ENV_CA] = self._env_ca

    def _make_tls(self) -> dict[str, tuple[str, ...]]:
        """A test CA and a certificate for the NameServer and the brokers (every process
        listens on 127.0.0.1); their command-line options by process."""
        from dledger.network.tls_certs import make_loopback_cluster_tls  # (cryptography: with TLS only)

        files = make_loopback_cluster_tls(  # (naming every node: their peers check it)
            os.path.join(self.base_dir, "tls"), self.group,
            [f"n{i}" for i in range(self.size + self.spares)])
        self.tls_ca = files.ca_file
        self._env_ca = os.environ.get(ENV_CA)
        os.environ[ENV_CA] = self.tls_ca
        self._namesrv_tls = files.namesrv_args
        return {"broker": files.broker_args}

    def __enter__(self) -> ChaosCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start_toxiproxy(self) -> None:
        try:  # the client needs the dev extra (toxiproxy-python, requests); --help does not
            from chaos.toxiproxy.client import ToxiproxyClient
        except ImportError as err:
            raise ClusterError(f"running a chaos scenario needs the dev extra "
                               f"(pip install -e '.[dev]'): {err}") from err
        log = open(os.path.join(self.base_dir, "toxiproxy.log"), "ab")  # noqa: SIM115
        with log:
            self._toxi_proc = subprocess.Popen(
                [sys.executable, "-m", "chaos.toxiproxy", "--host", "127.0.0.1", "--port", "0",
                 "--seed", str(self.seed)],
                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                start_new_session=True)
        line = _read_ready_line(self._toxi_proc, 20).decode()
        m = re.search(r"listening on (\S+):(\d+)", line)
        if m is None:
            raise ClusterError(f"unexpected toxiproxy banner {line!r}")
        self.toxi = ToxiproxyClient(f"http://{m.group(1)}:{m.group(2)}")

    def start_namesrv(self) -> None:
        log = open(os.path.join(self.base_dir, "namesrv.log"), "ab")  # noqa: SIM115
        with log:
            self._ns_proc = subprocess.Popen(
                [sys.executable, "-m", "namesrv", "--listen", self.namesrv, "--scan-interval-s", "1",
                 "--cluster-key-file", self.key_file, *self._namesrv_tls, *self.namesrv_args],
                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                start_new_session=True)
        json.loads(_read_ready_line(self._ns_proc, 20))

    def kill_namesrv(self) -> None:
        if self._ns_proc is not None:
            self._ns_proc.kill()
            self._ns_proc.wait(timeout=10)
            if self._ns_proc.stdout is not None:
                self._ns_proc.stdout.close()
            self._ns_proc = None

    def _proxy(self, src: str, dst: str, upstream: Address) -> Address:
        from chaos.toxiproxy.client import listen_address  # (loaded by _start_toxiproxy)

        assert self.toxi is not None
        proxy = self.toxi.create_proxy(f"{src}-{dst}", _fmt(upstream))
        self.proxies[(src, dst)] = listen_address(proxy)
        return self.proxies[(src, dst)]

    def _create_proxies(self) -> None:
        servers = self.brokers.servers
        for a, b in self.peer_links():
            self._proxy(a, b, servers[b].peer_address)
        ns_port = self.namesrv_port
        for nid, s in servers.items():
            client = self._proxy("c", nid, s.client_address)
            ns = self._proxy(nid, "ns", ("127.0.0.1", ns_port))
            dial = ",".join(f"{b}={_fmt(self.proxies[(nid, b)])}" for b in servers if b != nid)
            self.brokers.node_args[nid] = ("--dial", dial, "--advertise", _fmt(client),
                                           "--namesrv", _fmt(ns))
        # Fixed ports: a node restarted after a kill is where the clients left it (a 4.x client
        # reads routes every 30 s: one that still named a restarted leader's earlier port
        # failed every send to it until then, in a CI run of S18).
        for on, option in ((self.grpc, "--grpc-listen"), (self.remoting, "--remoting-listen")):
            if not on:
                continue
            for nid, port in zip(servers, free_ports(len(servers)), strict=True):
                self.brokers.node_args[nid] += (option, f"127.0.0.1:{port}")
                if option == "--grpc-listen":
                    self.grpc_addresses[nid] = f"127.0.0.1:{port}"

    # -- network faults ---------------------------------------------------------------------------

    def cut(self, links: Iterable[Link], streams: tuple[str, ...] = BOTH) -> None:
        """Blackhole each directed link: bytes in ``streams`` of its connections (upstream: from
        the dialling side, downstream: the answers) are swallowed (no reset, no close), so the
        sender learns nothing until its own timeouts fire."""
        assert self.toxi is not None
        for link in links:
            if link in self.cut_links:
                continue
            name = "-".join(link)
            for stream in streams:
                self.toxi.add_toxic(name, "timeout", stream, name=CUT_TOXICS[stream],
                                    attributes={"timeout": 0})
            self.cut_links[link] = streams

    def heal(self, links: Iterable[Link] | None = None) -> None:
        """Lift cuts (all of them by default). The connections that crossed a cut are reset: the
        bytes swallowed mid-stream would otherwise leave them out of frame."""
        assert self.toxi is not None
        for link in list(self.cut_links if links is None else links):
            if link not in self.cut_links:
                continue
            name = "-".join(link)
            self.toxi.disable(name)
            for stream in self.cut_links.pop(link):
                self.toxi.remove_toxic(name, CUT_TOXICS[stream])
            self.toxi.enable(name)

    def isolate(self, nodes: Iterable[str], clients: bool = False) -> list[Link]:
        """Cut every peer link between ``nodes`` and the rest (both directions); with
        ``clients`` also their client and NameServer links."""
        inside = set(nodes)
        links = [(a, b) for a, b in self.peer_links() if (a in inside) != (b in inside)]
        if clients:
            links += [("c", n) for n in inside] + [(n, "ns") for n in inside]
        self.cut(links)
        return links

    def silence(self, nid: str) -> list[Link]:
        """One-way silence of ``nid``: every byte it sends is swallowed (to its peers, to the
        NameServer, its answers to clients) while it still hears everything, as a node whose
        outbound path died. Returns the links to heal."""
        out = [(nid, b) for b in self.node_ids if b != nid] + [(nid, "ns")]
        self.cut(out, ("upstream",))  # the links it dials: what it writes
        self.cut([("c", nid)], ("downstream",))  # the clients dial it: its answers
        return [*out, ("c", nid)]

    def partition(self, sides: Iterable[Iterable[str]]) -> list[Link]:
        """Cut every peer link between different sides (nodes not named form one more side)."""
        side_of: dict[str, int] = {}
        for k, side in enumerate(sides):
            for n in side:
                side_of[n] = k
        links = [(a, b) for a, b in self.peer_links() if side_of.get(a, -1) != side_of.get(b, -1)]
        self.cut(links)
        return links

    def slow(self, links: Iterable[Link], latency_ms: int, jitter_ms: int) -> None:
        """Delay both streams of each link (latency toxic with jitter), replacing any delay."""
        assert self.toxi is not None
        for link in links:
            name = "-".join(link)
            attrs = {"latency": latency_ms, "jitter": jitter_ms}
            for stream in ("upstream", "downstream"):
                toxic = f"slow_{stream}"
                if link in self.slow_links:
                    self.toxi.update_toxic(name, toxic, attributes=attrs)
                else:
                    self.toxi.add_toxic(name, "latency", stream, name=toxic, attributes=attrs)
            self.slow_links.add(link)

    def unslow(self, links: Iterable[Link] | None = None) -> None:
        assert self.toxi is not None
        for link in list(self.slow_links if links is None else links):
            if link in self.slow_links:
                for stream in ("upstream", "downstream"):
                    self.toxi.remove_toxic("-".join(link), f"slow_{stream}")
                self.slow_links.discard(link)

    # -- process faults ----------------------------------------------------------------------------

    def running(self, nid: str) -> bool:
        return self.brokers.servers[nid].running

    def kill(self, nid: str) -> None:
        self.brokers.kill(nid, signal.SIGKILL)

    def restart(self, nid: str) -> None:
        if not self.running(nid):
            self.brokers.kill(nid)  # reap and close the dead process's pipe
            self.brokers.restart(nid)

    def pause(self, nid: str) -> None:
        self.brokers.kill(nid, signal.SIGSTOP)

    def resume(self, nid: str) -> None:
        self.brokers.kill(nid, signal.SIGCONT)

    def power_loss(self, nid: str, timeout_s: float = 10.0) -> int:
        """Pull the plug: the node discards every byte it has not fsynced (tearing the last
        write) and dies. Returns the bytes it discarded (from its log), -1 if unknown."""
        s = self.brokers.servers[nid]
        if s.proc is None or s.proc.poll() is not None:
            return 0
        s.proc.send_signal(signal.SIGUSR1)
        try:
            s.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            s.proc.kill()  # it did not get to discard: a plain crash
            s.proc.wait(timeout=10)
        self.brokers.kill(nid)
        found = re.findall(r"power loss: discarded_bytes=(\d+)", self.brokers.log_tail(nid, 20))
        return int(found[-1]) if found else -1

    def stop_node(self, nid: str) -> None:
        self.brokers.kill(nid, signal.SIGTERM)

    def corrupt(self, nid: str, rng: random.Random, kind: str = "bitflip") -> dict[str, Any]:
        """Damage the newest segment of a stopped node: flip bits (p = 1e-4 over the last 64 KiB
        of its entries) or cut 1-1024 bytes off its entries' end. Returns what was done. (The
        file of a killed node runs on past its entries with zeros: that tail is not the target.)"""
        assert not self.running(nid), "corrupt a stopped node only"
        log_dir = os.path.join(self.brokers.servers[nid].data_dir, "log")
        data = sorted(f for f in os.listdir(log_dir) if f.endswith(".data"))
        if not data:
            return {"node": nid, "kind": "none"}
        path = os.path.join(log_dir, data[-1])
        with open(path, "rb") as whole:
            size = len(whole.read().rstrip(b"\0"))  # where the entries end, give or take a zero
        if kind == "truncate":
            cut = min(size, rng.randint(1, 1024))
            os.truncate(path, size - cut)
            return {"node": nid, "kind": "truncate", "file": data[-1], "bytes": cut}
        start = max(0, size - 65536)
        with open(path, "r+b") as f:
            f.seek(start)
            buf = bytearray(f.read(size - start))
            if not buf:
                return {"node": nid, "kind": "none"}
            bits = max(1, int(len(buf) * 8 * 1e-4))
            for _ in range(bits):
                k = rng.randrange(len(buf))
                buf[k] ^= 1 << rng.randrange(8)
            f.seek(start)
            f.write(buf)
            f.flush()
            os.fsync(f.fileno())
        return {"node": nid, "kind": "bitflip", "file": data[-1], "bits": bits}

    def wipe_log(self, nid: str) -> None:
        """An operator's repair of a node whose log is damaged: drop its log and state-machine
        checkpoint, keep its term and vote; it refills from the leader."""
        data_dir = self.brokers.servers[nid].data_dir
        shutil.rmtree(os.path.join(data_dir, "log"), ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(data_dir, "broker.checkpoint"))

    def trace_paths(self) -> list[str]:
        return [p for p in (self.brokers.trace_path(n) for n in self.node_ids) if os.path.exists(p)]
