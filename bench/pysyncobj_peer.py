"""pysyncobj 0.3.17 as a benchmark peer: three processes on loopback, a replicated append.

Two faces:

* ``run_pysyncobj(...)`` (and ``python -m bench.pysyncobj_peer run ...``): the parent.
  It starts three node processes, waits until they form a cluster with one agreed leader,
  drives the workload through the leader and returns one dict of figures.
* ``python -m bench.pysyncobj_peer node --self ADDR --partners ADDR,ADDR``: one member
  (``pysyncobj_node``). It talks to the parent with one JSON object per line (commands on stdin,
  events on stdout).

Why the load runs inside the leader process: pysyncobj has no network client; the only way to
append is to call the ``@replicated`` method on a member. A call on a follower is forwarded to the
leader ('apply_command'), and the follower then waits until *it* learns the commit index from a
later append_entries, which adds a hop and up to one heartbeat to each call; so the driver runs on
the member that is leader, which is pysyncobj's fastest path.

Configuration (``SyncObjConf``), all defaults except:

* ``connectionRetryTime`` 5.0 -> 0.5 s: the member with the higher address dials the others; if it
  starts before they have bound, it would wait 5 s before retrying. Cluster formation only.
* ``appendEntriesUseBatch``: pysyncobj's documented trade-off. ``True`` (its default) ships new
  entries only on the next append-entries period (0.1 s), which makes one-at-a-time calls ~100 ms
  (~10/s); ``False`` sends at once ("improve single request speed") but costs one message per entry
  per follower. We use whichever is faster for each workload: ``False`` for "one", the default
  ``True`` for "inflight" (see ``DEFAULT_BATCH``); the choice is reported in the result (``conf``).
* no journal file and no dump file (the defaults): the log is in memory; pysyncobj never fsyncs.

The members' C library is told to keep freed memory (``MALLOC_ENV``) unless the caller asks for
glibc's defaults (``malloc="default"``). pysyncobj zlib-compresses every message; each call
allocates a deflate state of about 256 KiB, which glibc's defaults hand back to the kernel when it
is freed. Where the kernel's page faults are costly (a virtual machine that reports free pages to
its host: the 2-core box of 2026-12) that alone made one-at-a-time calls three times slower
(p50 0.42-0.49 against 0.14-0.17 ms); elsewhere it changes little. Neither setting touches
pysyncobj's code; the tuned one is its best case, so the benchmark compares with that.

This module owns the parent side and the command line; latency is measured in the member (see
``pysyncobj_node``).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.pysyncobj_node import CONNECTION_RETRY_S, node_main
from dledger.localcluster import free_ports

SYSTEM = "pysyncobj 0.3.17"
WORKLOADS = ("one", "inflight")
# appendEntriesUseBatch per workload when the caller does not choose; measured on the 2-core box:
#   one, 1 KiB:            False ~2,000/s p50 0.5 ms   | True (default) ~10/s p50 101 ms
#   inflight 1000, 1 KiB:  False ~4,800/s, 5.2 CPU-s   | True ~7,500/s, 0.8 CPU-s
#   inflight 1000, 128 B:  False ~7,800/s, 3.2 CPU-s   | True ~8,700/s, 0.4 CPU-s
# so pysyncobj's default (True) everywhere except one-at-a-time, where it would wait a heartbeat.
DEFAULT_BATCH = {"one": False, "inflight": True}
# glibc: serve allocations below 4 MiB from the heap, and trim the heap only above 128 MiB free
# (measured best of 4 and 16 MiB; a threshold glibc refuses leaves the defaults in place).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(4 << 20), "MALLOC_TRIM_THRESHOLD_": str(128 << 20)}
MALLOC_SETTINGS = ("tuned", "default")


class PeerBenchError(RuntimeError):
    """The pysyncobj peer benchmark failed or timed out; the message has the members' stderr tail."""


# --------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------


class _Member:
    def __init__(self, idx: int, addr: str, partners: list[str], batch: bool, max_life_s: float,
                 ready_timeout_s: float, workdir: str, malloc: str) -> None:
        self.idx = idx
        self.addr = addr
        self.stderr_path = os.path.join(workdir, f"node{idx}.stderr")
        self._stderr = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in close(), with the process
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        for key in MALLOC_ENV:
            env.pop(key, None)
        if malloc == "tuned":
            env.update(MALLOC_ENV)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.pysyncobj_peer", "node",
             "--self", addr, "--partners", ",".join(partners),
             "--batch", "1" if batch else "0",
             "--max-life-s", f"{max_life_s:.1f}",
             "--ready-timeout-s", f"{ready_timeout_s:.1f}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            cwd=root, env=env, text=True, bufsize=1,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, cmd: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise PeerBenchError(f"node {self.idx} ({self.addr}) is gone: {exc}") from exc

    def recv(self, deadline: float, events: tuple[str, ...]) -> dict[str, Any]:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PeerBenchError(
                    f"timed out waiting for {'/'.join(events)} from node {self.idx} ({self.addr})")
            try:
                line = self.lines.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            if line is None:
                self.proc.poll()
                raise PeerBenchError(
                    f"node {self.idx} ({self.addr}) exited (rc={self.proc.returncode}) while waiting "
                    f"for {'/'.join(events)}")
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                msg: dict[str, Any] = json.loads(line)  # a JSON text opening with "{"
            except ValueError:
                continue
            if msg.get("event") in events:
                return msg
            if msg.get("event") == "error":
                raise PeerBenchError(f"node {self.idx} ({self.addr}): {msg}")

    def request(self, cmd: dict[str, Any], deadline: float, events: tuple[str, ...]) -> dict[str, Any]:
        self.send(cmd)
        return self.recv(deadline, events)

    def stderr_tail(self, max_bytes: int = 3000) -> str:
        try:
            self._stderr.flush()
            with open(self.stderr_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                tail = f.read().decode("utf-8", "replace")
        except OSError as exc:
            tail = f"<cannot read stderr: {exc}>"
        return f"--- node {self.idx} ({self.addr}) stderr tail ---\n{tail}"

    def kill(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=10)
        except Exception:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f is not None:
                    f.close()
            except Exception:
                pass
        try:
            self._stderr.close()
        except Exception:
            pass


def _find_leader(members: list[_Member], deadline: float) -> _Member:
    """All three members connected and agreeing on one leader that says it is leader."""
    last: list[dict[str, Any]] = []
    while True:
        last = [m.request({"cmd": "status"}, deadline, ("status",)) for m in members]
        leaders = {s["leader"] for s in last}
        if len(leaders) == 1 and None not in leaders and all(s["connected"] for s in last):
            (leader_addr,) = leaders
            for m, s in zip(members, last):
                if m.addr == leader_addr and s["is_leader"]:
                    return m
        if time.monotonic() > deadline:
            raise PeerBenchError(f"no agreed leader before the deadline: {last}")
        time.sleep(0.05)


def run_pysyncobj(workload: str, payload_bytes: int, count: int, inflight: int = 1000,
                  timeout_s: float = 120, *, warmup: int | None = None, issuer: str = "callback",
                  batch: bool | None = None, malloc: str = "tuned") -> dict[str, Any]:
    """Run one workload against a fresh 3-process pysyncobj cluster on loopback.

    workload: "one" (one call at a time, each awaited) or "inflight" (``inflight`` outstanding).
    count: measured calls, after ``warmup`` unmeasured ones (default 200, or 2 x inflight).
    issuer: "callback" (refill from the completion callback) or "thread" (an app thread issues).
    batch: pysyncobj's appendEntriesUseBatch; None = DEFAULT_BATCH[workload].
    malloc: "tuned" (MALLOC_ENV, see the module docstring) or "default" (glibc's defaults).
    Returns the figures; raises PeerBenchError (with the members' stderr tails) on any failure or
    when ``timeout_s`` (whole run: start-up, warm-up, measurement, checks) runs out.
    """
    if workload not in WORKLOADS:
        raise ValueError(f"workload must be one of {WORKLOADS}, not {workload!r}")
    if issuer not in ("callback", "thread"):
        raise ValueError(f"issuer must be 'callback' or 'thread', not {issuer!r}")
    if malloc not in MALLOC_SETTINGS:
        raise ValueError(f"malloc must be one of {MALLOC_SETTINGS}, not {malloc!r}")
    if count <= 0 or payload_bytes < 0 or inflight <= 0:
        raise ValueError("count and inflight must be > 0, payload_bytes >= 0")
    k = 1 if workload == "one" else inflight
    if warmup is None:
        warmup = 200 if workload == "one" else max(200, 2 * inflight)
    if batch is None:
        batch = DEFAULT_BATCH[workload]

    t0 = time.monotonic()
    deadline = t0 + timeout_s
    ports = free_ports(3)
    addrs = [f"127.0.0.1:{p}" for p in ports]
    members: list[_Member] = []
    with tempfile.TemporaryDirectory(prefix="pysyncobj-bench-") as workdir:
        try:
            ready_timeout = min(30.0, max(1.0, timeout_s / 2))
            for i, addr in enumerate(addrs):
                partners = [a for a in addrs if a != addr]
                members.append(_Member(i, addr, partners, batch, timeout_s + 30.0, ready_timeout,
                                       workdir, malloc))
            for m in members:
                m.recv(deadline, ("ready",))
            leader = _find_leader(members, deadline)
            followers = [m for m in members if m is not leader]

            def phase(n: int) -> dict[str, Any]:
                budget = max(1.0, deadline - time.monotonic() - 2.0)
                res = leader.request(
                    {"cmd": "phase", "n": n, "k": k, "payload_bytes": payload_bytes,
                     "issuer": issuer, "timeout_s": budget},
                    deadline, ("phase",))
                if not res["finished"]:
                    raise PeerBenchError(
                        f"{workload}: only {res['completed']}/{n} calls completed before the "
                        f"deadline ({res})")
                return res

            if warmup:
                phase(warmup)
            before = {m.idx: m.request({"cmd": "status"}, deadline, ("status",)) for m in members}
            res = phase(count)
            applied = res["applied"]
            after = {m.idx: m.request({"cmd": "wait_applied", "n": applied,
                                       "timeout_s": max(0.5, min(20.0, deadline - time.monotonic() - 1))},
                                      deadline, ("applied",))
                     for m in members}
            # Replication check: the leader applied exactly the successful calls of both phases
            # (a failed call may or may not have been applied, so then only "at least"), and every
            # follower reached the same count.
            expected = before[leader.idx]["applied"] + res["entries"]
            if applied < expected or (applied != expected and res["failures"] == 0):
                raise PeerBenchError(f"leader applied {applied} entries, expected {expected} "
                                     f"(successful calls)")
            lagging = {m.addr: after[m.idx]["applied"] for m in followers if not after[m.idx]["ok"]}
            if lagging:
                raise PeerBenchError(f"followers did not reach {applied} applied entries: {lagging}")
            cpu_s = sum(after[m.idx]["cpu_s"] - before[m.idx]["cpu_s"] for m in members)
            return {
                "system": SYSTEM,
                "workload": workload,
                "payload_bytes": payload_bytes,
                "entries": res["entries"],
                "entries_per_s": res["entries_per_s"],
                "p50_ms": res["p50_ms"],
                "p99_ms": res["p99_ms"],
                "failures": res["failures"],
                "cpu_s": cpu_s,
                # extras
                "count": count,
                "inflight": k,
                "warmup": warmup,
                "issuer": issuer,
                "max_ms": res["max_ms"],
                "elapsed_s": res["elapsed_s"],
                "failure_reasons": res["failure_reasons"],
                "leader_cpu_s": res["cpu_s"],
                "applied": {m.addr: after[m.idx]["applied"] for m in members},
                "still_leader": res["still_leader"],
                "conf": {"appendEntriesUseBatch": batch, "connectionRetryTime": CONNECTION_RETRY_S,
                         "journalFile": None, "fullDumpFile": None, "malloc": malloc},
            }
        except PeerBenchError as exc:
            # One place adds every member's stderr tail (members are still alive: finally kills them).
            tails = "\n".join(m.stderr_tail() for m in members)
            raise PeerBenchError(f"{exc}\n{tails}" if tails else str(exc)) from None
        finally:
            for m in members:
                try:
                    if m.proc.poll() is None and m.proc.stdin is not None:
                        m.proc.stdin.close()  # lets a healthy member exit on EOF
                except Exception:
                    pass
            for m in members:
                m.kill()


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.pysyncobj_peer", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)

    node = sub.add_parser("node", help="run one cluster member (driven over stdin/stdout by the parent)")
    node.add_argument("--self", dest="self_addr", required=True, help="host:port of this member")
    node.add_argument("--partners", required=True, help="comma-separated host:port of the others")
    node.add_argument("--batch", type=int, default=0, help="appendEntriesUseBatch (0/1)")
    node.add_argument("--max-life-s", type=float, default=300.0, help="exit after this long regardless")
    node.add_argument("--ready-timeout-s", type=float, default=30.0)

    run = sub.add_parser("run", help="run one workload on a fresh 3-process cluster; print one JSON line")
    run.add_argument("--workload", choices=WORKLOADS, required=True)
    run.add_argument("--payload-bytes", type=int, default=1024)
    run.add_argument("--count", type=int, required=True)
    run.add_argument("--inflight", type=int, default=1000)
    run.add_argument("--timeout-s", type=float, default=120.0)
    run.add_argument("--warmup", type=int, default=None)
    run.add_argument("--issuer", choices=("callback", "thread"), default="callback")
    run.add_argument("--batch", choices=("auto", "0", "1"), default="auto")
    run.add_argument("--malloc", choices=MALLOC_SETTINGS, default="tuned")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.mode == "node":
        return node_main(args)
    batch = None if args.batch == "auto" else args.batch == "1"
    try:
        res = run_pysyncobj(args.workload, args.payload_bytes, args.count, args.inflight, args.timeout_s,
                            warmup=args.warmup, issuer=args.issuer, batch=batch, malloc=args.malloc)
    except PeerBenchError as exc:
        print(f"PeerBenchError: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
