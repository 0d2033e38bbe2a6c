"""A NameServer and a 3-node broker group on loopback for a test module to share (each test on
topics and groups of its own), ready once the NameServer routes the group's leader."""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import aiohttp

from dledger.localcluster import LocalCluster
from tests.test_broker_processes import BROKER, _start_namesrv
from tests.test_processes import wait_until


@contextmanager
def namesrv_and_group(base: Path, *broker_args: str) -> Iterator[str]:
    """The NameServer's address while both run (data under ``base``); both stopped after."""
    ns_proc, addr = _start_namesrv(base)
    try:
        with LocalCluster(str(base), size=3, tick_ms=50,
                          program=(*BROKER, "--namesrv", addr, "--register-interval-s", "1",
                                   *broker_args)):
            asyncio.run(_registered(addr))
            yield addr
    finally:
        ns_proc.terminate()
        ns_proc.wait(timeout=10)


async def _registered(addr: str) -> None:
    """Until the NameServer routes the group's leader (a cluster that just started registers
    within a second or two)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        async def led() -> bool:
            async with session.get(f"http://{addr}/v1/cluster") as resp:
                groups = (await resp.json())["groups"]
            return bool(groups) and all(g.get("leader") for g in groups)
        await wait_until(led, 30, "the group's registration")
