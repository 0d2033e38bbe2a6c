"""NATS JetStream's side of the growth workload (``bench.growth``; a tool, not a test):
``python -m bench.growth_nats --messages 1000000``.

A fresh 3-server JetStream cluster (``bench.broker``'s), one R3 stream, N messages of
``--bytes`` published with ``publish_async`` (a window of 4,096 unacknowledged); then, once every
server holds all N, each server's RSS and its anonymous part before and after, per stored
message. With ``--msg-ids`` each message carries a unique ``Nats-Msg-Id`` (JetStream's duplicate
window, 2 minutes by default, then holds every id, as our dedup table holds every unique key):
the run that does the same work as ours; without it, the run BENCH.md's NATS figures come from.
"""

from __future__ import annotations

import asyncio
import tempfile
import time

import click

from bench.broker import nats_available, nats_stream, start_nats
from bench.delay import rss_mib

WINDOW = 4096  # publishes awaiting their acknowledgement


async def _fill(urls: list[str], pids: list[int], n: int, size: int, msg_ids: bool) -> None:
    nc, js = await nats_stream(urls, "GROWTH", "growth", timeout=30,
                               publish_async_max_pending=WINDOW)
    await asyncio.sleep(2)  # (settled: the start is read after the stream exists)
    start = [(rss_mib(p), rss_mib(p, "RssAnon")) for p in pids]
    body = b"x" * size
    t0 = time.perf_counter()
    for i in range(n):
        headers = {"Nats-Msg-Id": f"U{i:016d}"} if msg_ids else None
        await js.publish_async("growth.x", body, headers=headers)
    await js.publish_async_completed()
    took_s = time.perf_counter() - t0
    held = 0
    for _ in range(600):  # every server has applied the stream (bounded: 60 s)
        held = (await js.stream_info("GROWTH")).state.messages
        if held >= n:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(2)
    click.echo(f"NATS JetStream R3: {n:,} messages of {size} B{' with unique Nats-Msg-Id' if msg_ids else ''}"
               f", published in {took_s:.1f} s ({n / took_s:,.0f} msg/s); the stream holds {held:,}")
    for i, (pid, (rss0, anon0)) in enumerate(zip(pids, start, strict=True)):
        rss1, anon1 = rss_mib(pid), rss_mib(pid, "RssAnon")
        click.echo(f"  n{i}: RSS {rss0:.1f} -> {rss1:.1f} MiB "
                   f"({(rss1 - rss0) * 2**20 / n:.0f} B per message), anonymous {anon0:.1f} -> "
                   f"{anon1:.1f} MiB ({(anon1 - anon0) * 2**20 / n:.0f} B per message)")
    await nc.close()


@click.command()
@click.option("--messages", "n", type=click.IntRange(min=1), default=1_000_000, show_default=True)
@click.option("--bytes", "size", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--msg-ids", is_flag=True, help="A unique Nats-Msg-Id on every message.")
def main(n: int, size: int, msg_ids: bool) -> None:
    missing = nats_available()
    if missing:
        raise click.ClickException(missing)
    with tempfile.TemporaryDirectory(prefix="nats-growth-") as d:
        procs, urls = start_nats(d)
        try:
            asyncio.run(_fill(urls, [p.pid for p in procs], n, size, msg_ids))
        finally:
            for p in procs:
                p.kill()
                p.wait(timeout=10)


if __name__ == "__main__":
    main()
