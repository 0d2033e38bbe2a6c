"""What a backlog costs a broker (the growth workload of docs/performance.md, issue 19 item 5; a tool, not a
test): ``python -m bench.growth --messages 100000,1000000``.

For each backlog size: a fresh NameServer and 3-node group (async flush, to fill it quickly;
memory does not depend on the flush mode), N messages of ``--bytes`` each, every one with a
unique key (as the producer sends them), in requests of 256 with 32 in flight, into 4 queues.
Then, with every node caught up, it reads:
- memory: each node's RSS and its anonymous part before and after, per retained message; the RSS
  at once and ``SETTLE_S`` later (what the burst freed returned to the system);
- the checkpoint's size on disk (the state machine a restart loads);
- restart: a follower killed (SIGKILL) right after the fill and started again, then one stopped
  (SIGTERM: it writes a last checkpoint) and started again: seconds until its process is ready,
  and until it has applied everything the group committed; then every node stopped and started
  again (a cold start of the group): seconds until a leader has applied its term's no-op;
- checkpoints under the backlog: for ``--watch`` seconds a trickle of sends keeps the periodic
  checkpoint writing; each node's RSS is sampled every 0.1 s and its high-water mark (reset at the
  start: ``/proc/PID/clear_refs``) read at the end: the peak against the median (issue 34 item 3);
- pulls: messages per second pulling one queue from its oldest offset (cold: the log's first
  pages, not read since they were written) and from near its tail (hot), 1024 a pull, from the
  leader, the same number of messages each.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import click

from bench.delay import PER_REQUEST, rss_mib, send_runs
from bench.harness import broker_group
from bench.nodeflags import NodeFlags
from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from protocol import broker_kinds as bp
from protocol.errors import DLedgerError

TOPIC = "growth"
QUEUES = 4
PULL_BATCH = 1024
SETTLE_S = 2.0  # two periods of the nodes' heap trimmer


async def _fill(client: LogClient, n: int, size: int) -> float:
    body = b"x" * size
    return await send_runs(client, n, lambda k0, count: [[TOPIC, (k0 // PER_REQUEST) % QUEUES, [
        [body, "", [], f"U{k0 + i:016d}", [], 0] for i in range(count)]]])


async def _status(client: LogClient, nid: str) -> dict[str, Any] | None:
    try:
        st: dict[str, Any] = await client.call(nid, bp.BROKER_STATUS, timeout_s=2.0)
        return st
    except DLedgerError:
        return None


async def _until(cond: Callable[[], Awaitable[Any]], timeout_s: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if await cond():
            return time.monotonic() - t0
        await asyncio.sleep(0.05)  # polling interval of a bounded wait
    raise RuntimeError(f"timed out after {timeout_s} s waiting for {what}")


async def _caught_up(client: LogClient, nodes: list[str]) -> bool:
    st = [await _status(client, n) for n in nodes]
    if any(s is None for s in st):
        return False
    commits = {s["raft"]["commit_index"] for s in st if s}
    return len(commits) == 1 and all(s["applied_index"] >= s["raft"]["commit_index"]
                                     for s in st if s)


async def _leader(client: LogClient, nodes: list[str]) -> str | None:
    for n in nodes:
        s = await _status(client, n)
        if s and s["raft"]["role"] == "leader" and s["applied_index"] >= s["raft"]["commit_index"]:
            return n
    return None


async def _pull_rate(client: LogClient, node: str, offset: int, count: int) -> float:
    got, t0 = 0, time.perf_counter()
    while got < count:
        _, nxt, _, _, rows = await client.call(node, bp.PULL, TOPIC, 0, offset, PULL_BATCH,
                                                    64 << 20, 0, ["*"])
        if not rows:
            break
        got += len(rows)
        offset = nxt
    return got / (time.perf_counter() - t0)


def _restart(cluster: LocalCluster, nid: str, sig: int = signal.SIGTERM) -> float:
    """Stop ``nid`` (SIGTERM: cleanly, it checkpoints; SIGKILL: a crash), start it again;
    seconds from the start until it says it is ready."""
    cluster.kill(nid, sig)
    t0 = time.monotonic()
    cluster.restart(nid)
    return time.monotonic() - t0


def _reset_peak(pid: int) -> bool:
    """Reset a process's RSS high-water mark (VmHWM), if this kernel and user may."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


async def _checkpoint_memory(client: LogClient, cluster: LocalCluster, nodes: list[str], n: int,
                             watch_s: float) -> None:
    """Peak RSS against steady RSS while periodic checkpoints of the backlog are written."""
    if watch_s <= 0:
        return
    pids = {nid: cluster.servers[nid].pid for nid in nodes}
    hwm = all(_reset_peak(pid) for pid in pids.values() if pid is not None)
    samples: dict[str, list[float]] = {nid: [] for nid in nodes}
    marks: dict[str, set[int]] = {nid: set() for nid in nodes}
    body, k, t0 = b"t" * 128, 0, time.monotonic()
    while time.monotonic() - t0 < watch_s:
        await client.call_leader(bp.SEND, TOPIC, k % QUEUES, [[body, "", [], f"T{n + k:016d}", [], 0]])
        k += 1
        for nid in nodes:
            samples[nid].append(rss_mib(pids[nid]))
            if k % 10 == 0:
                st = await _status(client, nid)
                if st is not None:
                    marks[nid].add(st["snapshot"]["checkpoint_index"])
        await asyncio.sleep(0.1)  # the sampling period of a benchmark (not a test's wait)
    click.echo(f"  checkpoints under the backlog ({watch_s:.0f} s, a send every 0.1 s):")
    for nid in nodes:
        steady = statistics.median(samples[nid])
        peak = rss_mib(pids[nid], "VmHWM") if hwm else max(samples[nid])
        click.echo(f"    {nid}: RSS steady {steady:.1f} MiB, peak {peak:.1f} MiB "
                   f"({peak / steady:.2f}x; {'high-water mark' if hwm else 'sampled'}), "
                   f"{len(marks[nid]) - 1} checkpoints written meanwhile")


async def _measure(cluster: LocalCluster, n: int, size: int, watch_s: float) -> None:
    nodes = list(cluster.servers)
    async with LogClient(cluster.client_addresses, timeout_s=30) as client:
        await client.call_leader(bp.TOPIC_PUT, TOPIC, QUEUES, QUEUES, 6)
        pids = {nid: cluster.servers[nid].pid for nid in nodes}
        before = {nid: (rss_mib(pids[nid]), rss_mib(pids[nid], "RssAnon")) for nid in nodes}
        took_s = await _fill(client, n, size)
        await _until(lambda: _caught_up(client, nodes), 900, "every node to apply the backlog")
        after = {nid: (rss_mib(pids[nid]), rss_mib(pids[nid], "RssAnon")) for nid in nodes}
        # what the nodes hold for the backlog, once their heap trimmer (every second) has given
        # back what the burst freed: the Raft entry cache, emptied as the last entries applied
        await asyncio.sleep(SETTLE_S)
        settled = {nid: rss_mib(pids[nid]) for nid in nodes}
        click.echo(f"{n:,} messages of {size} B with unique keys, sent in {took_s:.1f} s "
                   f"({n / took_s:,.0f} msg/s)")
        for nid in nodes:
            (r0, a0), (r1, a1), r2 = before[nid], after[nid], settled[nid]
            ckpt = os.path.join(cluster.servers[nid].data_dir, "broker.checkpoint")
            size_mib = os.path.getsize(ckpt) / 2**20 if os.path.exists(ckpt) else 0.0
            click.echo(f"  {nid}: RSS {r0:.1f} -> {r1:.1f} MiB ({(r1 - r0) * 2**20 / n:.0f} B "
                       f"per message) at once, {r2:.1f} MiB ({(r2 - r0) * 2**20 / n:.0f} B) "
                       f"{SETTLE_S:.0f} s later; anonymous {a0:.1f} -> {a1:.1f} MiB "
                       f"({(a1 - a0) * 2**20 / n:.0f} B per message); checkpoint "
                       f"{size_mib:.1f} MiB")
        await _checkpoint_memory(client, cluster, nodes, n, watch_s)
        leader = await _leader(client, nodes) or nodes[0]
        # a crash at once (the backlog's last seconds are after the last periodic checkpoint)
        crashed = next(nid for nid in nodes if nid != leader)
        ready_s = await asyncio.to_thread(_restart, cluster, crashed, signal.SIGKILL)
        caught_s = await _until(lambda: _caught_up(client, nodes), 600, "the crashed follower")
        click.echo(f"  follower {crashed} killed (-9) right after the fill and restarted: ready "
                   f"in {ready_s:.1f} s, caught up {caught_s:.1f} s later ({ready_s + caught_s:.1f}"
                   f" s in all)")
        per_queue = n // QUEUES
        sample = min(per_queue // 2, 100_000)
        cold = await _pull_rate(client, leader, 0, sample)
        hot = await _pull_rate(client, leader, per_queue - sample, sample)
        click.echo(f"  pulls from the leader, {sample:,} messages each: oldest {cold:,.0f} msg/s, "
                   f"tail {hot:,.0f} msg/s (cold/hot {cold / hot:.2f})")
        follower = next(nid for nid in nodes if nid != leader)
        ready_s = await asyncio.to_thread(_restart, cluster, follower)
        caught_s = await _until(lambda: _caught_up(client, nodes), 600, "the follower")
        click.echo(f"  follower {follower} restarted: ready in {ready_s:.1f} s, caught up "
                   f"{caught_s:.1f} s later ({ready_s + caught_s:.1f} s in all)")
        t0 = time.monotonic()
        await asyncio.to_thread(cluster.stop)
        await asyncio.to_thread(cluster.start)
        started_s = time.monotonic() - t0
        led_s = await _until(lambda: _leader(client, nodes), 600, "a leader after a cold start")
        click.echo(f"  every node stopped and started: processes ready in {started_s:.1f} s, a "
                   f"leader serving {led_s:.1f} s later ({started_s + led_s:.1f} s in all)")


@click.command()
@click.option("--messages", default="100000,1000000", show_default=True,
              help="Backlog sizes, comma separated.")
@click.option("--bytes", "size", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--watch", "watch_s", type=click.FloatRange(min=0), default=25.0, show_default=True,
              help="Seconds of checkpoints under the backlog to watch memory over (0: skip).")
def main(messages: str, size: int, watch_s: float) -> None:
    for n in [int(x) for x in messages.split(",") if x]:
        with broker_group("async", NodeFlags()) as (_, cluster):
            cluster.start_timeout_s = 600.0  # (a cold start loads the whole checkpoint)
            asyncio.run(_measure(cluster, n, size, watch_s))


if __name__ == "__main__":
    main()
