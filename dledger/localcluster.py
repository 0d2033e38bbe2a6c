"""Starts and stops a group of log server processes on loopback: used by ``dledger up``, the
benchmark and the real-process tests.

Owns process lifecycle only (ports, data directories, start/kill/restart, logs); it talks to
the servers through nothing but their stdout ready line. Every wait has a deadline and every
process started is stopped by ``stop()`` (also when used as a context manager).
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from dledger.port_claims import with_claims

Address = tuple[str, int]


class ClusterError(RuntimeError):
    """A server process did not start or stop as expected."""


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_ports(count: int, host: str = "127.0.0.1", claims: str | None = None) -> list[int]:
    """``count`` distinct ports that were free a moment ago, chosen below the kernel's ephemeral
    range: a server that must come back on the same port after a restart is given a fixed one,
    and a port from the ephemeral range could be handed, between our check and the server's
    bind (or while it is down), to any socket that binds port 0 or connects out (a proxy's
    listener, a client's connection). Outside that range only another such choice can take it,
    and the choices of every process of this user are claimed for a while
    (``dledger.port_claims``, the file ``claims``; by default one in the temp directory), so
    that no other picker hands them out meanwhile. Falls back to the kernel's choice when the
    range below is too small."""
    low, _ = _ephemeral_range()
    first = 10_000

    def choose(claimed: set[int]) -> list[int]:
        rng = random.SystemRandom()
        socks: list[socket.socket] = []
        try:
            if low - first >= 1_000:
                for port in rng.sample(range(first, low), min(low - first, 50 * count + 100)):
                    if len(socks) == count:
                        break
                    if port in claimed:
                        continue
                    s = socket.socket()
                    try:
                        s.bind((host, port))
                    except OSError:
                        s.close()
                        continue
                    socks.append(s)
            while len(socks) < count:
                s = socket.socket()
                s.bind((host, 0))
                socks.append(s)
            return [s.getsockname()[1] for s in socks]
        finally:
            for s in socks:
                s.close()

    return with_claims(choose, claims)


@dataclass
class ServerProcess:
    node_id: str
    peer_address: Address
    client_address: Address
    data_dir: str
    log_path: str
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    ready: dict[str, Any] = field(default_factory=dict)  # the last start's ready line
    log_start: int = 0  # where the last start's output begins in the (appended) log

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None


def describe_exit(returncode: int) -> str:
    """``Popen.returncode`` in words: "exited with code 1", "was killed by SIGKILL"."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"was killed by signal {-returncode}"


@dataclass
class LocalCluster:
    """``size`` log servers of group ``group`` under ``base_dir``."""

    base_dir: str
    size: int = 3
    group: str = "g"
    host: str = "127.0.0.1"
    flush_mode: str = "sync"
    tick_ms: int = 100
    election_ticks: int = 10
    extra_args: tuple[str, ...] = ()
    start_timeout_s: float = 20.0
    peer_port: int = 0  # first peer port (n0, n1, ... count up); 0: free ports picked at random
    client_port: int = 0  # first client port; 0: free ports picked at random
    trace: bool = False  # each node appends an event trace to <base_dir>/<group>-<id>.trace
    program: tuple[str, ...] = ("-m", "dledger.server")  # e.g. ("-m", "broker", "start")
    node_args: dict[str, tuple[str, ...]] = field(default_factory=dict)  # per node, e.g. --dial
    # The group is the first ``initial`` nodes (None: all): ``start`` starts them; the others
    # are spares, started by ``start_node`` with --join, to be added to the running group.
    initial: int | None = None
    servers: dict[str, ServerProcess] = field(default_factory=dict)

    def __post_init__(self) -> None:
        free = free_ports(self.size * 2, self.host)
        peer_ports = [self.peer_port + i for i in range(self.size)] if self.peer_port else free[::2]
        client_ports = ([self.client_port + i for i in range(self.size)] if self.client_port
                        else free[1::2])
        for i in range(self.size):
            nid = f"n{i}"
            self.servers[nid] = ServerProcess(
                nid, (self.host, peer_ports[i]), (self.host, client_ports[i]),
                os.path.join(self.base_dir, f"{self.group}-{nid}"),
                os.path.join(self.base_dir, f"{self.group}-{nid}.log"))

    @property
    def client_addresses(self) -> dict[str, Address]:
        return {nid: s.client_address for nid, s in self.servers.items()}

    def members(self) -> list[str]:
        """The nodes the group starts with."""
        ids = list(self.servers)
        return ids if self.initial is None else ids[: self.initial]

    def peers_arg(self, nid: str | None = None) -> str:
        """The group's first members (and ``nid``, a spare, itself)."""
        ids = self.members() + ([nid] if nid is not None and nid not in self.members() else [])
        return ",".join(f"{n}={h}:{p}" for n in ids for h, p in [self.servers[n].peer_address])

    def command(self, nid: str) -> list[str]:
        s = self.servers[nid]
        spare = nid not in self.members()
        return [sys.executable, *self.program, "--group", self.group, "--id", nid,
                "--peers", self.peers_arg(nid), *(["--join"] if spare else []),
                "--client-listen", f"{s.client_address[0]}:{s.client_address[1]}",
                "--data-dir", s.data_dir, "--flush-mode", self.flush_mode,
                "--tick-ms", str(self.tick_ms), "--election-ticks", str(self.election_ticks),
                *(["--trace", self.trace_path(nid)] if self.trace else []),
                *self.extra_args, *self.node_args.get(nid, ())]

    def trace_path(self, nid: str) -> str:
        return os.path.join(self.base_dir, f"{self.group}-{nid}.trace")

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> LocalCluster:
        """Start the group's nodes; if one does not come up, the others are stopped too (they
        were left running by a test whose node could not bind its port) and the error raised."""
        os.makedirs(self.base_dir, exist_ok=True)
        try:
            for nid in self.members():
                self._spawn(nid)
            for nid in self.members():
                self._await_ready(nid)
        except BaseException:
            self.stop()
            raise
        return self

    def start_node(self, nid: str) -> None:
        """Start a node that is not running (a spare joins the running group)."""
        self.restart(nid)

    def restart(self, nid: str) -> None:
        if self.servers[nid].running:
            raise ClusterError(f"{nid} is still running")
        self._spawn(nid)
        self._await_ready(nid)

    def kill(self, nid: str, sig: int = signal.SIGKILL) -> None:
        s = self.servers[nid]
        if s.proc is None:
            return
        if s.proc.poll() is None:
            s.proc.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self._reap(s)

    def stop(self) -> None:
        for _nid, s in self.servers.items():
            if s.proc is not None and s.proc.poll() is None:
                s.proc.send_signal(signal.SIGCONT)
                s.proc.terminate()
        for s in self.servers.values():
            # one SIGTERM only: a second one, landing after the server's loop has closed its
            # signal handlers, would kill a process that was stopping cleanly
            if s.proc is not None:
                self._reap(s)

    def _reap(self, s: ServerProcess) -> None:
        """Wait for a signalled process to exit (SIGKILL after 10 s), then close its files."""
        assert s.proc is not None
        try:
            s.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait(timeout=10)
        self._close(s)

    def __enter__(self) -> LocalCluster:
        if not any(s.running for s in self.servers.values()):
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, nid: str, lines: int = 30) -> str:
        try:
            with open(self.servers[nid].log_path, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def log_of_last_start(self, nid: str, max_bytes: int = 64 << 10) -> str:
        """What the node's current (or last) process wrote to its log, at most the last
        ``max_bytes`` of it: the log file is appended to by every start."""
        s = self.servers[nid]
        try:
            with open(s.log_path, "rb") as f:
                f.seek(max(s.log_start, f.seek(0, os.SEEK_END) - max_bytes))
                return f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    # -- internals ----------------------------------------------------------------------------------

    def _spawn(self, nid: str) -> None:
        s = self.servers[nid]
        os.makedirs(s.data_dir, exist_ok=True)
        logf = open(s.log_path, "ab")  # noqa: SIM115 - owned by the child's lifetime
        s.log_start = logf.tell()
        try:
            s.proc = subprocess.Popen(self.command(nid), stdout=subprocess.PIPE, stderr=logf,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            logf.close()
        s.starts += 1

    def _await_ready(self, nid: str) -> None:
        s = self.servers[nid]
        assert s.proc is not None and s.proc.stdout is not None
        deadline = time.monotonic() + self.start_timeout_s
        buf = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([s.proc.stdout], [], [], 0.1)
            if ready:
                chunk = os.read(s.proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                buf += chunk
                if b"\n" in buf:
                    line = json.loads(buf.split(b"\n", 1)[0])
                    if line.get("event") == "ready":
                        s.ready = line
                        return
            if s.proc.poll() is not None:
                break
        self.kill(nid)
        raise ClusterError(f"{nid} did not start:\n{self.log_tail(nid)}")

    @staticmethod
    def _close(s: ServerProcess) -> None:
        if s.proc is not None and s.proc.stdout is not None:
            s.proc.stdout.close()
