"""Test helpers: a NameServer with one broker group registered with it, ready for the client
library (a send has been routed), stopped by PID when the block ends."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from client import Message, Producer, UnavailableError
from client.cluster.routes import GroupRoute, Routes
from dledger.localcluster import LocalCluster
from tests.broker.test_broker_processes import BROKER, _start_namesrv
from tests.nodes.test_processes import wait_until


async def routed(ns: str, deadline_s: float = 30.0) -> None:
    """Wait (with a deadline) until the NameServer routes sends to a group."""
    async with Producer(ns) as p:
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                await p.send(Message("warmup", b"x"))
                return
            except UnavailableError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)  # polling the NameServer until the route shows


async def registered_group(routes: Routes, nodes: int = 3, deadline_s: float = 30.0) -> GroupRoute:
    """The only registered group once ``nodes`` of its nodes are registered (a group client
    made earlier would not know a node that registered later)."""
    found: list[GroupRoute] = []

    async def all_there() -> bool:
        groups = await routes.cluster_groups()
        found[:] = groups
        return len(groups) == 1 and len(groups[0].nodes) >= nodes
    await wait_until(all_there, deadline_s, f"{nodes} nodes registered")
    return found[0]


async def console_ok(snapshot: Callable[[], Awaitable[dict[str, Any]]], nodes: int = 3,
                     deadline_s: float = 30.0) -> dict[str, Any]:
    """The console's first snapshot (from ``snapshot()``) of one group of ``nodes`` nodes, all
    answering, with a leader: the fixtures wait only for a route to the leader, a follower may
    register a moment later, and a node that misses one poll (1 s) is shown unreachable."""
    seen: list[dict[str, Any]] = []

    async def ok() -> bool:
        seen[:] = [await snapshot()]
        groups = seen[0]["groups"]
        return len(groups) == 1 and len(groups[0]["nodes"]) == nodes \
            and groups[0]["health"] == "ok" and groups[0]["leader"] is not None
    await wait_until(ok, deadline_s, f"a console snapshot with {nodes} nodes answering")
    return seen[0]


@contextlib.contextmanager
def namesrv_group(base: Path, *broker_args: str, size: int = 3, name: str = "a",
                  initial: int | None = None) -> Iterator[tuple[str, LocalCluster]]:
    """A NameServer and a broker group ``name`` of ``size`` nodes (``broker_args`` added to each
    broker's command line; with ``initial``, only the first that many form the group, the others
    are spares: ``LocalCluster.initial``); yields the NameServer's address and the group once
    routed."""
    ns_proc, ns = _start_namesrv(base)
    try:
        with LocalCluster(str(base / name), size=size, tick_ms=50, group=name, initial=initial,
                          program=(*BROKER, *broker_args, "--namesrv", ns,
                                   "--register-interval-s", "1")) as cluster:
            asyncio.run(routed(ns))
            yield ns, cluster
    finally:
        ns_proc.terminate()
        ns_proc.wait(timeout=10)


@contextlib.contextmanager
def namesrv_groups(base: Path, *broker_args: str, names: tuple[str, ...] = ("a", "b"),
                   size: int = 3) -> Iterator[tuple[str, dict[str, LocalCluster]]]:
    """A NameServer and a broker group of ``size`` nodes per name, all registered with it;
    yields the NameServer's address and the groups by name once sends are routed."""
    ns_proc, ns = _start_namesrv(base)
    try:
        with contextlib.ExitStack() as stack:
            clusters = {name: stack.enter_context(LocalCluster(
                str(base / name), size=size, tick_ms=50, group=name,
                program=(*BROKER, *broker_args, "--namesrv", ns, "--register-interval-s", "1")))
                for name in names}
            asyncio.run(routed(ns))
            yield ns, clusters
    finally:
        ns_proc.terminate()
        ns_proc.wait(timeout=10)
