"""What pending delayed messages cost a broker: ``python -m bench.delay --messages 1000000``.

Starts a NameServer and a 3-node broker group (the node defaults, async flush so that the run
takes a minute rather than ten), reads each node's resident memory, sends N messages of
``--bytes`` each with delay level 18 (2 h: all stay pending) in requests of 256 with 32 in
flight, waits until every node has applied them, and reads the memory again. Prints each node's
RSS before and after and the growth per pending message.

``--plain`` sends the same messages undelayed: the difference between the two runs is what
delay scheduling itself costs (the rest, about 200 B a message, is what any stored message
costs today: the consume-queue unit, the log's entry cache, the allocator's arenas; issue 19).

Sends carry no unique key by default (``--unique-keys`` to give each one): a unique key costs
the dedup table's row (issue 19 bounds that table), which is not the delay index's cost.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import click

from bench.harness import broker_group
from bench.nodeflags import NodeFlags
from dledger.client import LogClient
from protocol import broker_kinds as bp

PER_REQUEST = 256
IN_FLIGHT = 32


def rss_mib(pid: int | None, field: str = "VmRSS") -> float:
    """A process's resident memory (``VmRSS``), or one part of it: ``RssAnon`` (the heap, what
    the process itself holds) or ``RssFile`` (file pages mapped in: the log's segments)."""
    if pid is None:
        raise RuntimeError("the node is not running")
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for pid {pid}")


async def send_runs(client: LogClient, n: int,
                    runs_of: Callable[[int, int], list[Any]]) -> float:
    """Send ``n`` messages as SEND_RUNS requests of PER_REQUEST, IN_FLIGHT at a time;
    ``runs_of(first, count)`` builds one request's runs. Returns the seconds it took."""
    sent = 0
    t0 = time.monotonic()

    async def one() -> None:
        nonlocal sent
        while sent < n:
            k0, count = sent, min(PER_REQUEST, n - sent)
            sent += count
            answers = (await client.call_leader(bp.SEND_RUNS, runs_of(k0, count),
                                                timeout_s=60))[1]
            if answers[0][0] != "SEND_OK":
                raise RuntimeError(f"send refused: {answers[0]}")
    await asyncio.gather(*(one() for _ in range(IN_FLIGHT)))
    return time.monotonic() - t0


async def _fill(client: LogClient, n: int, size: int, unique_keys: bool, plain: bool) -> float:
    body = b"x" * size
    props = [] if plain else [["DELAY", "18"]]
    return await send_runs(client, n, lambda k0, count: [["pending", 0, [
        [body, "", [], f"K{k0 + i:012d}" if unique_keys else "", props, 0]
        for i in range(count)]]])


async def _applied_everywhere(client: LogClient, nodes: list[str], n: int,
                              deadline_s: float, plain: bool) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        stored = []
        for nid in nodes:
            if plain:
                hi = (await client.call(nid, bp.PULL, "pending", 0, 0, 0, 0, 0, []))[3]
                stored.append(int(hi) - 1)  # (the warm-up message)
            else:
                st = await client.call(nid, bp.BROKER_STATUS)
                stored.append(int(st["timers"]["pending"]))
        if min(stored) >= n:
            return
        await asyncio.sleep(0.5)  # the followers apply what they were sent
    raise RuntimeError("the followers did not apply every delayed message in time")


@click.command()
@click.option("--messages", type=click.IntRange(min=1), default=1_000_000, show_default=True)
@click.option("--bytes", "size", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--unique-keys", is_flag=True, help="Give every message a unique key.")
@click.option("--plain", is_flag=True, help="Send them undelayed (the comparison run).")
def main(messages: int, size: int, unique_keys: bool, plain: bool) -> None:
    with broker_group("async", NodeFlags()) as (_, cluster):
        async def run() -> None:
            async with LogClient(cluster.client_addresses, timeout_s=30) as client:
                await client.call_leader(bp.SEND, "pending", 0, [[b"warm", "", [], "", [], 0]])
                nodes = list(cluster.servers)
                before = {nid: rss_mib(cluster.servers[nid].pid) for nid in nodes}
                anon0 = {nid: rss_mib(cluster.servers[nid].pid, "RssAnon") for nid in nodes}
                took_s = await _fill(client, messages, size, unique_keys, plain)
                await _applied_everywhere(client, nodes, messages, 300, plain)
                after = {nid: rss_mib(cluster.servers[nid].pid) for nid in nodes}
                anon = {nid: rss_mib(cluster.servers[nid].pid, "RssAnon") for nid in nodes}
                what = "stored undelayed" if plain else "pending delayed"
                click.echo(f"{messages:,} {what} messages of {size} B "
                           f"({'unique keys' if unique_keys else 'no unique keys'}), sent in "
                           f"{took_s:.1f} s ({messages / took_s:,.0f} msg/s)")
                for nid in nodes:
                    grown = after[nid] - before[nid]
                    click.echo(f"  {nid}: RSS {before[nid]:.1f} -> {after[nid]:.1f} MiB "
                               f"(+{grown:.1f} MiB, {grown * 2**20 / messages:.0f} B per message); "
                               f"of it anonymous +{anon[nid] - anon0[nid]:.1f} MiB "
                               f"({(anon[nid] - anon0[nid]) * 2**20 / messages:.0f} B per message)")
        asyncio.run(run())


if __name__ == "__main__":
    main()
