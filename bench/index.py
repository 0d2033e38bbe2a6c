"""What the key index costs a broker, and how fast it answers:
``python -m bench.index --messages 1000000`` (issue 18, item 4; a tool, not a test).

Starts a NameServer and a 3-node broker group (async flush, node defaults), reads each node's
memory, sends N messages of ``--bytes`` each, every one with a key (``key-<i>``) and a unique
key, in requests of 256 with 32 in flight, waits until every node has applied them, and reads
the memory again: VmRSS, RssAnon (the heap: what the index would add if it kept a Python
object per key) and RssFile (file pages mapped in: the log and the index files' pages a query
touched). Then asks ``--queries`` random keys one at a time, by key of the leader and of a
follower, and by unique key of the leader, and prints the latency percentiles and the size of
the index files on disk.

``--plain`` sends the same messages with no key and no unique key (nothing indexed); the
difference between the two runs' RSS growth is what keyed messages cost, the dedup table's rows
of their unique keys included. ``--apply-only`` isolates the index: no cluster, the same keyed
entries applied in this process to a ``BrokerState`` with a ``KeyIndex`` beside it (apply time
per message, RssAnon growth, the index's own walk time), or with ``--plain`` to the state alone
(run the two as two processes: memory one run freed would hide the other's growth).
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import time

import click

from bench.delay import PER_REQUEST, rss_mib, send_runs
from bench.harness import broker_group
from bench.nodeflags import NodeFlags
from broker.core.entries import encode_runs
from broker.features.query.index import IndexConfig, KeyIndex, key_hash
from broker.machine.state import BrokerState
from dledger.client import LogClient
from protocol import broker_kinds as bp

TOPIC = "keyed"
FIELDS = ("VmRSS", "RssAnon", "RssFile")


async def _fill(client: LogClient, n: int, size: int, keyed: bool) -> float:
    body = b"x" * size
    return await send_runs(client, n, lambda k0, count: [[TOPIC, (k0 // PER_REQUEST) % 4, [
        [body, "", [f"key-{k0 + i}"] if keyed else [], f"U{k0 + i:012d}" if keyed else "", [], 0]
        for i in range(count)]]])


async def _applied_everywhere(client: LogClient, nodes: list[str], deadline_s: float) -> None:
    leader = client.leader or nodes[0]
    target = int((await client.call(leader, bp.BROKER_STATUS))["applied_index"])
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        applied = [int((await client.call(nid, bp.BROKER_STATUS))["applied_index"])
                   for nid in nodes]
        if min(applied) >= target:
            return
        await asyncio.sleep(0.5)  # the followers apply what they were sent
    raise RuntimeError("the followers did not apply every message in time")


def _pct(lat: list[float], p: float) -> float:
    lat = sorted(lat)
    return lat[min(len(lat) - 1, round(p / 100 * (len(lat) - 1)))]


async def _latencies(client: LogClient, node: str, n: int, queries: int,
                     unique: bool) -> tuple[list[float], int]:
    rng = random.Random(18)
    lat, found = [], 0
    for _ in range(queries):
        i = rng.randrange(n)
        t0 = time.perf_counter()
        if unique:
            rows = await client.call(node, bp.QUERY_BY_UNIQUE_KEY, f"U{i:012d}", "", 16)
        else:
            rows = await client.call(node, bp.QUERY_BY_KEY, TOPIC, f"key-{i}", 0, 2**63 - 1, 16)
        lat.append((time.perf_counter() - t0) * 1000)
        found += len(rows) == 1
    return lat, found


def _du_mib(path: str) -> float:
    total = 0
    for name in os.listdir(path):
        total += os.stat(os.path.join(path, name)).st_blocks * 512
    return total / 2**20


def _apply_only(n: int, size: int, queries: int, with_index: bool) -> None:
    body = b"x" * size
    state = BrokerState()
    index = KeyIndex.open(tempfile.mkdtemp(prefix="bench-index-"), state.registry, IndexConfig()) \
        if with_index else None
    anon0 = rss_mib(os.getpid(), "RssAnon")
    took_s, position = 0.0, 0
    for e in range(n // PER_REQUEST):
        k0 = e * PER_REQUEST
        payload = encode_runs(1_700_000_000_000 + e, [[TOPIC, e % 4, [
            [body, "", [f"key-{k0 + i}"], f"U{k0 + i:012d}", [], 0]
            for i in range(PER_REQUEST)], True, 4]])
        t0 = time.perf_counter()
        state.apply(e + 1, position, payload)
        if index is not None:
            index.add(e + 1, position, state.last_entry)
            index.end_batch()
        took_s += time.perf_counter() - t0
        position += len(payload) + 64
    done = n // PER_REQUEST * PER_REQUEST
    click.echo(f"{'state + key index' if with_index else 'state alone'}: {done:,} keyed messages "
               f"applied in {took_s:.2f} s ({took_s / done * 1e6:.2f} us a message), RssAnon "
               f"+{rss_mib(os.getpid(), 'RssAnon') - anon0:.1f} MiB")
    if index is None:
        return
    rng = random.Random(18)
    lat = []
    for _ in range(queries):
        i = rng.randrange(done)
        t0 = time.perf_counter()
        hits = list(index.candidates(key_hash(TOPIC, f"key-{i}")))
        lat.append((time.perf_counter() - t0) * 1000)
        assert len(hits) == 1, hits
    click.echo(f"  index walk of {queries} random keys: p50 {_pct(lat, 50) * 1000:.1f} us, "
               f"p99 {_pct(lat, 99) * 1000:.1f} us")
    index.close()


@click.command()
@click.option("--messages", type=click.IntRange(min=1), default=1_000_000, show_default=True)
@click.option("--bytes", "size", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--queries", type=click.IntRange(min=1), default=2000, show_default=True)
@click.option("--plain", is_flag=True, help="Send them with no key (the comparison run).")
@click.option("--apply-only", is_flag=True,
              help="In this process, no cluster: the state machine with the key index "
                   "(with --plain: alone).")
def main(messages: int, size: int, queries: int, plain: bool, apply_only: bool) -> None:
    if apply_only:
        _apply_only(messages, size, queries, with_index=not plain)
        return
    with broker_group("async", NodeFlags()) as (_, cluster):
        async def run() -> None:
            async with LogClient(cluster.client_addresses, timeout_s=30) as client:
                await client.call_leader(bp.SEND, TOPIC, 0, [[b"warm", "", [], "", [], 0]])
                nodes = list(cluster.servers)
                pids = {nid: cluster.servers[nid].pid for nid in nodes}
                before = {(nid, f): rss_mib(pids[nid], f) for nid in nodes for f in FIELDS}
                took_s = await _fill(client, messages, size, not plain)
                await _applied_everywhere(client, nodes, 600)
                after = {(nid, f): rss_mib(pids[nid], f) for nid in nodes for f in FIELDS}
                what = "with no key" if plain else "each with a key and a unique key"
                click.echo(f"{messages:,} messages of {size} B {what}, sent in {took_s:.1f} s "
                           f"({messages / took_s:,.0f} msg/s)")
                for nid in nodes:
                    grown = {f: after[(nid, f)] - before[(nid, f)] for f in FIELDS}
                    click.echo(f"  {nid}: RSS {before[(nid, 'VmRSS')]:.1f} -> "
                               f"{after[(nid, 'VmRSS')]:.1f} MiB (+{grown['VmRSS']:.1f} MiB, "
                               f"{grown['VmRSS'] * 2**20 / messages:.0f} B per message); "
                               f"anonymous +{grown['RssAnon']:.1f} MiB "
                               f"({grown['RssAnon'] * 2**20 / messages:.0f} B per message), "
                               f"file pages +{grown['RssFile']:.1f} MiB")
                if plain:
                    return
                leader = client.leader or nodes[0]
                follower = next(nid for nid in nodes if nid != leader)
                for label, node, unique in (("by key, leader", leader, False),
                                            ("by key, follower", follower, False),
                                            ("by unique key, leader", leader, True)):
                    lat, found = await _latencies(client, node, messages, queries, unique)
                    click.echo(f"  query {label} ({queries} random keys, {found} found once): "
                               f"p50 {_pct(lat, 50):.2f} ms, p99 {_pct(lat, 99):.2f} ms, "
                               f"max {max(lat):.2f} ms")
                for nid in nodes:
                    index_dir = os.path.join(cluster.servers[nid].data_dir, "index")
                    st = await client.call(nid, bp.BROKER_STATUS)
                    click.echo(f"  {nid}: index {st['key_index']['files']} file(s), "
                               f"{st['key_index']['entries']:,} entries, "
                               f"{_du_mib(index_dir):.1f} MiB on disk; RSS after the queries "
                               f"{rss_mib(pids[nid]):.1f} MiB")
        asyncio.run(run())


if __name__ == "__main__":
    main()
