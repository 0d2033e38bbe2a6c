"""How dledger's processes run: on uvloop when installed (fewer microseconds per hop on the
commit path: about a third off one-at-a-time commit latency here), the standard asyncio loop
otherwise, or when DLEDGER_LOOP=asyncio asks for it; and, for server processes, with the cyclic
garbage collector's thresholds raised (``SERVER_GC_THRESHOLDS``). Library code never picks a loop
nor touches the collector: only process entry points (server, CLI, benchmark) call ``run``.

Why the collector: a server allocates a few container objects per message (decoded frames,
lists of a batch) and holds large long-lived tables (the dedup index, apply results). At the
default threshold of 700 allocations the young collections run every few dozen messages and the
older ones keep re-walking the large tables; measured on the broker's batch path (1 KiB, 3
replicas, 2 cores), the raised thresholds cut the servers' CPU per message by about a fifth.
Nothing in dledger relies on prompt collection of cycles: memory is freed by reference counts."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from dledger.openssl import import_without_ssl

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    if os.environ.get("DLEDGER_LOOP") == "asyncio":
        return None
    try:
        uvloop = import_without_ssl("uvloop")  # (a server without TLS has no ssl: see there)
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


SERVER_GC_THRESHOLDS = (50_000, 20, 100)  # generation 0, 1, 2 (CPython's defaults: 700, 10, 10)


def run(coro: Coroutine[Any, Any, T], server: bool = False) -> T:
    if server:
        gc.set_threshold(*SERVER_GC_THRESHOLDS)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)
