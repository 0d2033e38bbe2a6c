"""The log server's in-leader load (``LOCAL_LOAD``, allowed by ``--enable-bench``): proposers
inside the leader process, each commit's done callback submitting the next, the way pysyncobj
is driven (it has no network client, and its driver refills from its completion callback). The
benchmark (``bench.log``) asks for it to measure the log without a client's network hops.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable
from typing import Any

from dledger.node.runtime import Node
from protocol.errors import DLedgerError

__all__ = ["chained_loop", "run_local_load"]


async def run_local_load(node: Node, payload_bytes: int, count: int, concurrency: int,
                         warmup: int) -> dict[str, Any]:
    """Benchmark hook: ``concurrency`` proposals in flight inside this (leader) process, each
    commit's callback submitting the next, the way pysyncobj is driven (it has no network client,
    and its driver refills from its completion callback). Returns the latencies."""
    payload = os.urandom(payload_bytes)
    cpu0 = time.process_time()
    latencies_ms, elapsed, failures = await chained_loop(lambda: node.submit(payload), count,
                                                        concurrency, warmup)
    return {"latencies_ms": latencies_ms, "elapsed_s": elapsed, "failures": failures,
            "leader_cpu_s": time.process_time() - cpu0}


async def chained_loop(submit: Callable[[], asyncio.Future[Any]], count: int, concurrency: int,
                       warmup: int) -> tuple[list[float], float, int]:
    """As ``closed_loop``, for proposers inside the leader: each commit's done callback submits
    the next proposal, with no task hop in between (the way pysyncobj's driver refills from its
    completion callback). Returns (latencies in ms, elapsed seconds of the measured part,
    failures)."""
    latencies_ms: list[float] = []
    failures = 0

    async def phase(total: int, measure: bool) -> None:
        nonlocal failures
        done = asyncio.get_running_loop().create_future()
        left, running = total, 0

        def issue() -> None:
            nonlocal left, running, failures
            while left > 0 and not done.done():
                left -= 1
                t0 = time.perf_counter()
                try:
                    fut = submit()
                except DLedgerError:
                    failures += 1
                    continue
                except Exception as err:  # handed to the phase (a callback cannot raise it)
                    if not done.done():
                        done.set_exception(err)
                    return
                running += 1
                fut.add_done_callback(functools.partial(finished, t0))
                return
            if running == 0 and not done.done():
                done.set_result(None)

        def finished(t0: float, fut: asyncio.Future[object]) -> None:
            nonlocal running, failures
            running -= 1
            if fut.cancelled() or fut.exception() is not None:
                failures += 1
            elif measure:
                latencies_ms.append((time.perf_counter() - t0) * 1000)
            issue()

        for _ in range(max(1, min(concurrency, total))):
            issue()
        await done

    await phase(max(1, warmup), False)
    t0 = time.perf_counter()
    await phase(count, True)
    return latencies_ms, time.perf_counter() - t0, failures
