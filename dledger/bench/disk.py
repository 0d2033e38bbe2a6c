"""The disk's share of a ``sync`` commit: how long one entry's write and fdatasync take on the
filesystem the benchmark's groups use, with 1, 2 and 3 processes flushing at once (the replicas
of a local group share one disk). Measured in the same run as the table, so a reader can tell
what of a ``sync`` latency is the machine's and what is ours. A tool, not a test.

A ``sync`` commit needs two of the three replicas to have written and fdatasynced the entry:
with one proposer, a follower flushes while the leader flushes its own copy, two flushes of one
disk at once. So ``floor_ms`` adds the two-writer fdatasync p50 to the ``async`` round trip (the
same path with no fsync): an estimate of the best a ``sync`` round trip can do here, not a proved
bound (in a real group the flushes overlap other work and were seen to take longer).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Barrier
from multiprocessing.queues import Queue

from dledger.entry_codec import HEADER_BYTES

ENTRY_OVERHEAD_BYTES = HEADER_BYTES  # what the commitlog adds to a body
_START_TIMEOUT_S = 30.0  # for every writer process to be up
_RUN_TIMEOUT_S = 120.0  # for a writer's rounds, once started


class FlushProbeError(RuntimeError):
    """The disk probe could not run (a writer failed, e.g. on a full disk, or hung)."""


@dataclass(frozen=True)
class FlushFigure:
    writers: int  # processes appending and flushing at the same time, one file each
    payload_bytes: int
    flushes: int  # per writer
    p50_ms: float  # of one write + fdatasync, over all writers
    p99_ms: float


def flush_loop(path: str, entry_bytes: int, count: int, start: Barrier,
               out: Queue[list[float]]) -> None:
    """Append ``entry_bytes`` and fdatasync, ``count`` times, once every writer is at the
    barrier; puts each round's seconds on ``out``. Runs in a writer process."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        data = os.urandom(entry_bytes)
        start.wait(_START_TIMEOUT_S)
        rounds = []
        for _ in range(count):
            t0 = time.perf_counter()
            os.write(fd, data)
            os.fdatasync(fd)
            rounds.append(time.perf_counter() - t0)
        out.put(rounds)
    finally:
        os.close(fd)


def _pct_ms(sorted_s: list[float], p: float) -> float:
    k = min(len(sorted_s) - 1, max(0, round(p / 100 * (len(sorted_s) - 1))))
    return sorted_s[k] * 1000


def measure_flushes(payload_bytes: int, writers: int, count: int,
                    dir_path: str | None = None) -> FlushFigure:
    """``writers`` processes, each appending one entry of ``payload_bytes`` and fdatasyncing it
    ``count`` times in a file of its own under ``dir_path`` (default: the temp dir, where the
    benchmark's groups keep their logs), all starting together."""
    if writers < 1 or count < 1 or payload_bytes < 0:
        raise ValueError(f"bad flush probe: {writers} writers, {count} flushes, {payload_bytes} B")
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(writers), ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="dledger-flush-", dir=dir_path) as d:
        procs = [ctx.Process(target=flush_loop, daemon=True,
                             args=(os.path.join(d, f"w{i}"), payload_bytes + ENTRY_OVERHEAD_BYTES,
                                   count, start, out))
                 for i in range(writers)]
        for proc in procs:
            proc.start()
        try:
            rounds = sorted(s for _ in procs for s in _next_result(out, procs))
        finally:
            for proc in procs:
                proc.join(_START_TIMEOUT_S)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
    return FlushFigure(writers, payload_bytes, count, _pct_ms(rounds, 50), _pct_ms(rounds, 99))


def _next_result(out: Queue[list[float]], procs: list[BaseProcess]) -> list[float]:
    """One writer's rounds; FlushProbeError as soon as a writer has died without them."""
    deadline = time.monotonic() + _RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            return out.get(timeout=0.2)
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise FlushProbeError(f"a flush probe writer exited with code {dead[0]}") from None
    raise FlushProbeError(f"flush probe writers gave no result within {_RUN_TIMEOUT_S} s")


def floor_ms(async_p50_ms: float, two_writers: FlushFigure) -> float:
    """Estimated best ``sync`` one-proposer p50: the ``async`` round trip plus a follower's
    fdatasync while the leader flushes too (see the module docstring)."""
    return async_p50_ms + two_writers.p50_ms
