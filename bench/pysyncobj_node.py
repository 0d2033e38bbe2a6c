"""One pysyncobj member of the benchmark: ``python -m bench.pysyncobj_peer node ...`` runs
``node_main`` here, in its own process, driven by the parent (``pysyncobj_peer``) with one JSON
object per line: commands on stdin (``status``, ``phase``, ``wait_applied``, ``exit``), events
on stdout (``ready``, ``status``, ``phase``, ``applied``, ``error``).

Owns the replicated state (a count, a byte total and the last few payloads) and the load a
``phase`` drives inside the member that leads (see ``pysyncobj_peer`` for why there).
Latency is measured per call, from just before the ``append(...)`` call to its callback; only
callbacks with ``FAIL_REASON.SUCCESS`` count as entries, the others are counted as failures.
pysyncobj is imported only here, and only when a member runs.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import math
import os
import sys
import threading
import time
from typing import Any

__all__ = ["CONNECTION_RETRY_S", "node_main"]

CONNECTION_RETRY_S = 0.5
TAIL_KEEP = 4  # payloads kept by the replicated state (the rest is only counted)


def _make_log_class() -> type[Any]:
    # Imported lazily so that importing this module (for run_pysyncobj) does not need pysyncobj.
    from pysyncobj import SyncObj, replicated

    class ReplicatedAppendLog(SyncObj):  # type: ignore[misc]  # pysyncobj has no type hints: Any
        """The replicated state: a count, a byte total and the last few payloads."""

        # Class-level defaults; the instance attributes are assigned after SyncObj.__init__ so that
        # pysyncobj counts them as state (it snapshots the instance __dict__ keys present at the
        # end of its __init__ as "its own" and serializes only the others on log compaction).
        entries = 0
        total_bytes = 0

        def __init__(self, self_addr: str, partners: list[str], conf: Any) -> None:
            super().__init__(self_addr, partners, conf=conf)
            self.entries = 0
            self.total_bytes = 0
            self.tail: collections.deque[bytes] = collections.deque(maxlen=TAIL_KEEP)

        @replicated  # type: ignore[untyped-decorator]  # pysyncobj has no type hints
        def append(self, payload: bytes) -> int:
            self.entries += 1
            self.total_bytes += len(payload)
            self.tail.append(payload)
            return self.entries

    return ReplicatedAppendLog


def _percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (p in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


class _Phase:
    """Issue ``n`` appends with at most ``k`` outstanding; record per-call latency.

    issuer="callback": the first k calls are issued by the caller's thread, every later one from
    the completion callback (pysyncobj's tick thread), so a freed slot is refilled in the same tick.
    issuer="thread": the caller's thread issues every call and sleeps on a condition between them,
    as an application thread would.
    """

    def __init__(self, obj: Any, payload: bytes, n: int, k: int, issuer: str) -> None:
        from pysyncobj import FAIL_REASON

        self._success = FAIL_REASON.SUCCESS
        self.obj = obj
        self.payload = payload
        self.n = n
        self.k = max(1, min(k, n)) if n else 1
        self.chain = issuer == "callback"
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.issued = 0
        self.completed = 0
        self.ok = 0
        self.failures: collections.Counter[int] = collections.Counter()
        self.t_issue = [0.0] * n
        self.latencies: list[float] = []
        self.t_start = 0.0
        self.t_end = 0.0
        self._pumping = False

    def _pump(self) -> None:
        # Called with self.lock held. Iterative (a callback fired synchronously from inside
        # append(), e.g. QUEUE_FULL, re-enters the RLock and just lets this loop go on).
        if self._pumping:
            return
        self._pumping = True
        try:
            while self.issued < self.n and self.issued - self.completed < self.k:
                i = self.issued
                self.issued += 1
                t = time.perf_counter()
                if i == 0:
                    self.t_start = t
                self.t_issue[i] = t
                self.obj.append(self.payload, callback=functools.partial(self._on_done, i))
        finally:
            self._pumping = False

    def _on_done(self, i: int, _res: Any, err: int) -> None:
        t = time.perf_counter()
        with self.lock:
            self.completed += 1
            if err == self._success:
                self.ok += 1
                self.latencies.append(t - self.t_issue[i])
            else:
                self.failures[int(err)] += 1
            if self.completed >= self.n:
                self.t_end = t
                self.cond.notify_all()
                return
            if self.chain:
                self._pump()
            else:
                self.cond.notify_all()

    def run(self, deadline: float) -> bool:
        """Run to completion or until ``deadline`` (monotonic); True if every call completed."""
        if self.n == 0:
            return True
        with self.cond:
            while self.completed < self.n:
                if not self.chain or self.issued == 0:
                    self._pump()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.cond.wait(min(remaining, 0.5))
        return True

    def summary(self) -> dict[str, Any]:
        with self.lock:
            lat = sorted(self.latencies)
            elapsed = (self.t_end or time.perf_counter()) - self.t_start if self.issued else 0.0
            return {
                "issued": self.issued,
                "completed": self.completed,
                "entries": self.ok,
                "failures": sum(self.failures.values()),
                "failure_reasons": {str(k): v for k, v in sorted(self.failures.items())},
                "elapsed_s": elapsed,
                "entries_per_s": self.ok / elapsed if elapsed > 0 else 0.0,
                "p50_ms": _percentile(lat, 50) * 1000.0,
                "p99_ms": _percentile(lat, 99) * 1000.0,
                "max_ms": (lat[-1] * 1000.0) if lat else float("nan"),
            }


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _node_status(obj: Any) -> dict[str, Any]:
    leader = obj._getLeader()
    return {
        "event": "status",
        "self": obj.selfNode.address,
        "is_leader": bool(obj._isLeader()),
        "leader": leader.address if leader is not None else None,
        "term": obj.raftCurrentTerm,
        "ready": bool(obj.isReady()),
        "connected": all(obj.isNodeConnected(n) for n in obj.otherNodes),
        "applied": obj.entries,
        "cpu_s": time.process_time(),
    }


def node_main(args: argparse.Namespace) -> int:
    from pysyncobj import SyncObjConf

    # Watchdog: a member never outlives its budget, whatever happens to the parent.
    watchdog = threading.Timer(args.max_life_s, lambda: os._exit(3))
    watchdog.daemon = True
    watchdog.start()

    conf = SyncObjConf(
        appendEntriesUseBatch=bool(args.batch),
        connectionRetryTime=CONNECTION_RETRY_S,
        journalFile=None,
        fullDumpFile=None,
    )
    partners = [p for p in args.partners.split(",") if p]
    obj = _make_log_class()(args.self_addr, partners, conf)

    deadline = time.monotonic() + args.ready_timeout_s
    while True:
        st = _node_status(obj)
        if st["ready"] and st["connected"] and st["leader"] is not None:
            break
        if time.monotonic() > deadline:
            _emit({"event": "error", "error": "cluster not ready", "status": st})
            os._exit(2)
        time.sleep(0.01)
    st["event"] = "ready"
    _emit(st)

    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            cmd = json.loads(line)
            op = cmd["cmd"]
            if op == "status":
                _emit(_node_status(obj))
            elif op == "phase":
                if not obj._isLeader():
                    _emit({"event": "error", "error": "not leader", "status": _node_status(obj)})
                    continue
                payload = os.urandom(int(cmd["payload_bytes"]))
                applied_before = obj.entries
                cpu0 = time.process_time()
                phase = _Phase(obj, payload, int(cmd["n"]), int(cmd["k"]), cmd.get("issuer", "callback"))
                finished = phase.run(time.monotonic() + float(cmd["timeout_s"]))
                cpu1 = time.process_time()
                out = phase.summary()
                out.update(
                    event="phase",
                    finished=finished,
                    cpu_s=cpu1 - cpu0,
                    applied_before=applied_before,
                    applied=obj.entries,
                    still_leader=bool(obj._isLeader()),
                )
                _emit(out)
            elif op == "wait_applied":
                target = int(cmd["n"])
                end = time.monotonic() + float(cmd["timeout_s"])
                while obj.entries < target and time.monotonic() < end:
                    time.sleep(0.005)
                st = _node_status(obj)
                st["event"] = "applied"
                st["ok"] = obj.entries == target
                _emit(st)
            elif op == "exit":
                break
            else:
                _emit({"event": "error", "error": f"unknown command {op!r}"})
        except Exception as exc:  # report and keep serving; the parent decides
            _emit({"event": "error", "error": f"{type(exc).__name__}: {exc}"})
    try:
        obj.destroy()
    finally:
        sys.stdout.flush()
        os._exit(0)
