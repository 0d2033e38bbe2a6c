"""A closed-loop load: N proposers, each awaiting its commit before the next one. Used by the
benchmark from a client process and by the server's in-leader benchmark hook. Also an open-loop
light load at a fixed rate, and the CPU seconds of server processes, read from /proc, that both
benchmarks report."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Sequence

from protocol.errors import DLedgerError


async def closed_loop(call: Callable[[], Awaitable[object]], count: int, concurrency: int,
                      warmup: int, per_caller: Sequence[Callable[[], Awaitable[object]]] = (),
                      failure: tuple[type[Exception], ...] = (DLedgerError,),
                      ) -> tuple[list[float], float, int]:
    """Run ``warmup`` unmeasured then ``count`` measured calls with ``concurrency`` callers.
    With ``per_caller``, caller i makes ``per_caller[i % len(per_caller)]`` instead of ``call``
    (e.g. each producer its own topic). A call raising one of ``failure`` counts as failed.
    Returns (latencies in ms, elapsed seconds of the measured part, failures)."""
    latencies_ms: list[float] = []
    failures = 0

    async def caller(i: int, n: int, measure: bool) -> None:
        nonlocal failures
        call_i = per_caller[i % len(per_caller)] if per_caller else call
        for _ in range(n):
            t0 = time.perf_counter()
            try:
                await call_i()
            except failure:
                failures += 1
                continue
            if measure:
                latencies_ms.append((time.perf_counter() - t0) * 1000)

    await asyncio.gather(*(caller(i, max(1, warmup // concurrency), False) for i in range(concurrency)))
    t0 = time.perf_counter()
    await asyncio.gather(*(caller(i, max(1, count // concurrency), True) for i in range(concurrency)))
    return latencies_ms, time.perf_counter() - t0, failures


async def paced_loop(call: Callable[[], Awaitable[object]], rate_per_s: float, duration_s: float,
                     failure: tuple[type[Exception], ...] = (DLedgerError,),
                     ) -> tuple[list[float], float, int]:
    """An open-loop light load: ``rate_per_s * duration_s`` calls, the i-th started at i / rate
    seconds from the start, or as soon as the previous one ends when it is late (one caller:
    no burst to catch up). A call raising one of ``failure`` counts as failed. Returns
    (latencies in ms, elapsed seconds, failures)."""
    latencies_ms: list[float] = []
    failures = 0
    t0 = time.perf_counter()
    for i in range(max(1, round(rate_per_s * duration_s))):
        delay_s = t0 + i / rate_per_s - time.perf_counter()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        start = time.perf_counter()
        try:
            await call()
        except failure:
            failures += 1
            continue
        latencies_ms.append((time.perf_counter() - start) * 1000)
    return latencies_ms, time.perf_counter() - t0, failures


def processes_cpu_s(pids: list[int]) -> float:
    """CPU seconds used so far (user + system) by the processes ``pids``; gone ones count 0."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return total


def percentile(sorted_values: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of an ascending list; NaN if it is empty."""
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]
