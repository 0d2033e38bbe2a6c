"""What the broker benchmarks share: a fresh NameServer and broker group (``broker_group``), the
server processes' CPU and memory (``Servers``), a result row (``Row``) and a closed-loop run's
rate and percentiles (``closed``, ``pct``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass

from bench.load import closed_loop, processes_cpu_s
from bench.nodeflags import NodeFlags
from dledger.localcluster import LocalCluster
from protocol.cluster_key import KEY_FILE_NAME, generate_key_file

__all__ = ["Row", "Servers", "broker_group", "closed", "pct"]

GROUP, SIZE = "g", 3  # broker_group's group: nodes n0..n2 (LocalCluster's names)


@dataclass
class Row:
    system: str
    mode: str
    workload: str
    payload_bytes: int
    msgs_per_s: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    note: str = ""
    cpu_s_per_10k: float | None = None  # CPU seconds of the 3 server processes per 10,000 msgs
    peak_rss_mib: float | None = None  # the largest server process's peak resident memory so far


class Servers:
    """The CPU and memory of a system's server processes, read from /proc (Linux)."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids

    def cpu_s(self) -> float:
        return processes_cpu_s(self.pids)

    def peak_rss_mib(self) -> float | None:
        peaks = []
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/status") as f:
                    peaks += [int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:")]
            except (OSError, IndexError, ValueError):
                continue
        return round(max(peaks), 1) if peaks else None

    def measured(self, row: Row, cpu0_s: float, count: int) -> Row:
        """``row`` with the CPU used since ``cpu0_s`` per 10,000 of ``count`` messages."""
        row.cpu_s_per_10k = round((self.cpu_s() - cpu0_s) / max(1, count) * 10_000, 3)
        row.peak_rss_mib = self.peak_rss_mib()
        return row


def pct(lat: list[float], p: float) -> float | None:
    if not lat:
        return None
    lat = sorted(lat)
    return lat[min(len(lat) - 1, round(p / 100 * (len(lat) - 1)))]


def warm_up(n: int) -> int:
    """The unmeasured calls ``closed`` makes before its ``n`` measured ones."""
    return min(200, n // 5)


async def closed(call: Callable[[], Awaitable[object]], n: int, k: int,
                  per_caller: Sequence[Callable[[], Awaitable[object]]] = (),
                  ) -> tuple[float, float | None, float | None]:
    lat, elapsed, _ = await closed_loop(call, n, k, warmup=warm_up(n), per_caller=per_caller)
    return len(lat) / elapsed if elapsed else 0.0, pct(lat, 50), pct(lat, 99)


async def pipelined(send_batch: Callable[[], Awaitable[object]], batch: int, n: int,
                    in_flight: int) -> tuple[int, float]:
    """The fastest-path workload: ``in_flight`` pipelines, each sending its next batch of
    ``batch`` messages as its last one is answered, until ``n`` messages (rounded up to whole
    batches) are sent. Returns (messages sent, messages per second)."""
    sent = 0
    t0 = time.perf_counter()

    async def pipeline() -> None:
        nonlocal sent
        while sent < n:
            sent += batch
            await send_batch()

    await asyncio.gather(*(pipeline() for _ in range(in_flight)))
    return sent, sent / (time.perf_counter() - t0)


@contextlib.contextmanager
def broker_group(mode: str, flags: NodeFlags, register_interval_s: float = 1.0,
                 extra: tuple[str, ...] = (), tls: bool = False) -> Iterator[tuple[str, LocalCluster]]:
    """A fresh NameServer and 3-node broker group in flush mode ``mode``, with the node options
    ``flags``: (the NameServer's address, the group). Stopped on leaving. ``tls``: TLS everywhere
    (mutual on peer links), the clients of this process pointed at the CA (DLEDGER_TLS_CA)."""
    with tempfile.TemporaryDirectory(prefix="dledger-broker-bench-") as d, \
            contextlib.ExitStack() as stack:
        files = None
        if tls:
            from dledger.network.tls_certs import loopback_tls_env  # (cryptography: with --tls only)
            files = stack.enter_context(loopback_tls_env(os.path.join(d, "tls"), GROUP,
                                                         [f"n{i}" for i in range(SIZE)]))
        key_file = os.path.join(d, KEY_FILE_NAME)  # signs the registrations
        generate_key_file(key_file)
        ns_proc = subprocess.Popen([sys.executable, "-m", "namesrv", "--listen", "127.0.0.1:0",
                                    "--cluster-key-file", key_file,
                                    *(files.namesrv_args if files else ())],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert ns_proc.stdout is not None
            host, port = json.loads(ns_proc.stdout.readline())["listen"]
            ns = f"{host}:{port}"
            program = ("-m", "broker", "start", "--namesrv", ns, "--cluster-key-file", key_file,
                       "--register-interval-s", f"{register_interval_s:g}")
            with LocalCluster(d, size=SIZE, group=GROUP, flush_mode=mode, program=program,
                              extra_args=(*flags.args(), *extra,
                                          *(files.broker_args if files else ()))) as cluster:
                yield ns, cluster
        finally:
            ns_proc.terminate()
            ns_proc.wait(timeout=10)
