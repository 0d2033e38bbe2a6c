"""Which event loop dledger's processes run on: uvloop when installed (fewer microseconds per
hop on the commit path: about a third off one-at-a-time commit latency here), the standard
asyncio loop otherwise, or when DLEDGER_LOOP=asyncio asks for it. Library code never picks a
loop: only process entry points (server, CLI, benchmark) call ``run``."""

from __future__ import annotations

import asyncio
import os
from typing import Any, Callable, Coroutine, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    if os.environ.get("DLEDGER_LOOP") == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)
