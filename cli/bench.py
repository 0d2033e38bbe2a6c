"""``dledger bench``: a thin command over ``bench.broker``, which owns the workloads, the options,
the NATS peer, the measurements and the charts."""

from __future__ import annotations

import sys
from typing import Any

import click

from bench import broker as broker_bench  # light at import: the peers load when a run starts


@click.command()
@broker_bench.options
def bench(**opts: Any) -> None:
    """Benchmark a 3-node broker group (both flush modes) against NATS JetStream R3, side by side:
    sync, 64 concurrent, 64 concurrent over 64 topics, batch, consume, failover. The replicated log
    alone: python -m bench.log."""
    sys.exit(broker_bench.main(**opts))
