"""``dledger bench --remoting``: the RocketMQ 4.x C++ client (PyPI ``rocketmq-client-python``,
driven by ``bench.remoting_driver`` in its own environment, ``make clients``) through the
brokers' remoting endpoints against our own client, in one run on one broker group, sync
flush: a sync send's p50 (one at a time) and the throughput of 64 sends in flight (64 threads,
each a sync send). The 4.x client sends to the group's leader (its route's broker id 0). Each
row says its ratio to our client's and the servers' CPU per message against ours. A tool, not a
test.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from bench.grpc import CONCURRENCY, DEFAULT_FLAGS, OURS, our_rows
from bench.harness import Row, Servers, broker_group, pct
from bench.nodeflags import NodeFlags

__all__ = ["CPP_PYTHON", "run_remoting"]

CPP = "RocketMQ4 C++"
CPP_PYTHON = Path(__file__).resolve().parents[1] / ".venv-clients" / "rmq4" / "bin" / "python"
DRIVER = Path(__file__).with_name("remoting_driver.py")
PHASE_TIMEOUT_S = 600.0


def _line(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the 4.x client ended: {proc.stderr.read() if proc.stderr else ''}")
    out: dict[str, Any] = json.loads(line)
    return out


def _cpp(ns: str, servers: Servers, topic: str, size: int, n: int) -> list[Row]:
    if not CPP_PYTHON.exists():
        raise RuntimeError(f"{CPP_PYTHON} is missing: run `make clients`")
    proc = subprocess.Popen(
        [str(CPP_PYTHON), str(DRIVER), "--namesrv", ns, "--topic", topic, "--size", str(size),
         "--count", str(n), "--concurrency", str(CONCURRENCY)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "HOME": os.environ.get("TMPDIR", "/tmp"), "PYTHONPATH": ""})
    assert proc.stdin is not None
    rows = []
    try:
        _line(proc)  # ready
        for workload in ("sync", "concurrent"):
            cpu0 = servers.cpu_s()
            proc.stdin.write("go\n")
            proc.stdin.flush()
            got = _line(proc)
            lat = got["lat_ms"]
            rows.append(servers.measured(Row(CPP, "sync", workload, size,
                                             len(lat) / got["elapsed_s"], pct(lat, 50),
                                             pct(lat, 99)), cpu0, len(lat)))
        proc.wait(PHASE_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return rows


def run_remoting(size: int, n: int, flags: NodeFlags = DEFAULT_FLAGS) -> list[Row]:
    """Both clients against one fresh group (sync flush), ``size``-byte messages."""
    body = os.urandom(size)
    with broker_group("sync", flags, extra=("--remoting-listen", "127.0.0.1:0")) as (ns, cluster):
        servers = Servers([s.proc.pid for s in cluster.servers.values() if s.proc is not None])
        ours = asyncio.run(our_rows(ns, servers, f"bench-ours-{size}", body, n))
        theirs = _cpp(ns, servers, f"bench-remoting-{size}", size, n)
    by = {r.workload: r for r in ours}
    for r in theirs:
        mine = by[r.workload]
        r.note = (f"{r.msgs_per_s / mine.msgs_per_s:.2f}x our client's msgs/s, "
                  f"p50 {r.p50_ms / mine.p50_ms:.2f}x" if mine.msgs_per_s and mine.p50_ms
                  and r.p50_ms else "")
        if mine.cpu_s_per_10k and r.cpu_s_per_10k:
            r.note += f", CPU {r.cpu_s_per_10k / mine.cpu_s_per_10k:.1f}x"
    assert all(r.system == OURS for r in ours)
    return [*ours, *theirs]
