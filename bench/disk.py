"""The disk's share of a ``sync`` commit: how long one entry's write and fdatasync take on the
filesystem the benchmark's groups use, with 1, 2 and 3 processes flushing at once (the replicas
of a local group share one disk). Measured in the same run as the table, so a reader can tell
what of a ``sync`` latency is the machine's and what is ours. A tool, not a test.

A ``sync`` commit needs two of the three replicas to have written and fdatasynced the entry:
with one proposer, a follower flushes while the leader flushes its own copy, two flushes of one
disk at once (the third replica flushes too). So ``sync_estimate_ms`` adds the two-writer
fdatasync p50 to the ``async`` round trip (the same path with no fsync): a hopeful estimate of
what a ``sync`` round trip can do here, not a proved bound (in a live group the flushes arrive
staggered and were seen to take longer).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier

from bench.load import percentile
from dledger.storage.entry_codec import HEADER_BYTES

_START_TIMEOUT_S = 30.0  # for every writer process to be up
_RUN_TIMEOUT_S = 120.0  # for a writer's rounds, once started


class FlushProbeError(RuntimeError):
    """The disk probe could not run (a writer failed, e.g. on a full disk, or hung)."""


@dataclass(frozen=True)
class FlushFigure:
    writers: int  # processes writing and flushing at the same time, one file each
    payload_bytes: int
    flushes: int  # per writer
    p50_ms: float  # of one write + fdatasync, over all writers' rounds
    p99_ms: float
    samples: int  # rounds timed, all writers together


def flush_loop(path: str, entry_bytes: int, count: int, start: Barrier,
               out: Queue[list[float]]) -> None:
    """Write ``entry_bytes`` and fdatasync, ``count`` times, once every writer is at the
    barrier; puts each round's seconds on ``out``. Runs in a writer process. As the commitlog
    does, the entries go one after another into a file already filled with zeros and fsynced,
    so a flush writes data pages only (no new file size to commit)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        data = os.urandom(entry_bytes)
        os.pwrite(fd, bytes(entry_bytes * count), 0)
        os.fsync(fd)
        start.wait(_START_TIMEOUT_S)
        rounds = []
        for k in range(count):
            t0 = time.perf_counter()
            os.pwrite(fd, data, k * entry_bytes)
            os.fdatasync(fd)
            rounds.append(time.perf_counter() - t0)
        out.put(rounds)
    finally:
        os.close(fd)


def measure_flushes(payload_bytes: int, writers: int, count: int, dir_path: str | None = None,
                    writer: Callable[..., None] = flush_loop) -> FlushFigure:
    """``writers`` processes, each writing one entry of ``payload_bytes`` and fdatasyncing it
    ``count`` times in a file of its own under ``dir_path`` (default: the temp dir, where the
    benchmark's groups keep their logs), all starting together. ``writer`` is the loop each
    process runs (``flush_loop``; tests pass one that fails)."""
    if writers < 1 or count < 1 or payload_bytes < 0:
        raise ValueError(f"bad flush probe: {writers} writers, {count} flushes, {payload_bytes} B")
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(writers), ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="dledger-flush-", dir=dir_path) as d:
        procs = [ctx.Process(target=writer, daemon=True,
                             args=(os.path.join(d, f"w{i}"), payload_bytes + HEADER_BYTES,
                                   count, start, out))
                 for i in range(writers)]
        try:
            for proc in procs:
                proc.start()
            rounds = sorted(s for _ in procs for s in _next_result(out, procs))
        finally:
            start.abort()  # on an error, writers still waiting to start give up at once
            for proc in procs:
                if proc.pid is not None:
                    proc.join(_START_TIMEOUT_S)
                    if proc.is_alive():
                        proc.kill()
                        proc.join()
    return FlushFigure(writers, payload_bytes, count, percentile(rounds, 50) * 1000,
                       percentile(rounds, 99) * 1000, len(rounds))


def _next_result(out: Queue[list[float]], procs: Sequence[BaseProcess]) -> list[float]:
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


def sync_estimate_ms(async_p50_ms: float, two_writers: FlushFigure) -> float:
    """A hopeful estimate of the ``sync`` one-proposer p50: the ``async`` round trip plus a
    follower's fdatasync while the leader flushes too (see the module docstring)."""
    return async_p50_ms + two_writers.p50_ms
