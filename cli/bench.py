"""``dledger bench``: a thin command over ``broker.bench``, which owns the workloads, the NATS
peer, the measurements and the charts."""

from __future__ import annotations

import sys

import click


@click.command()
@click.option("--quick", is_flag=True, help="A short run (2,000 messages per workload).")
@click.option("--payloads", default="128,1024", show_default=True)
@click.option("--out", "out_dir", default="bench-results", show_default=True,
              type=click.Path(file_okay=False), help="Where the JSON and the PNG chart go.")
def bench(quick: bool, payloads: str, out_dir: str) -> None:
    """Benchmark a 3-node broker group (both flush modes) against NATS JetStream R3, side by side:
    sync, 64 concurrent, batch, consume, failover. The replicated log alone: python -m dledger.bench."""
    from broker import bench as broker_bench  # loaded on use: it imports the benchmark's peers
    sys.exit(broker_bench.main(quick, [int(p) for p in payloads.split(",") if p], out_dir))
