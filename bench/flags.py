"""Measurements to decide the node defaults of ``--busy-poll-us`` and ``--quorum-first``: a broker
group (NameServer + 3 nodes, fresh for each run) with and without them, in alternating runs,
both flush modes. Per run, in this order:

- idle: the CPU the 3 node processes use over ``--idle-s`` with a connected, silent producer
  (from /proc/PID/stat of each node, by PID), as % of one core;
- light load: one producer at ``--light-rate`` messages/s for ``--light-s`` (open loop): the
  nodes' CPU, % of one core, and the sends' p50;
- one producer awaiting each acknowledgement: p50, p99 and the nodes' CPU per 10,000 messages;
- 64 concurrent producers (one ``Producer``): messages/s and CPU per 10,000 messages.

    python -m bench.flags                    # 3 rounds, 1 KiB: about 10 minutes
    python -m bench.flags --variants off,busy,quorum-first,both  # each option alone too
    python -m bench.flags --quick            # a smoke run: its figures measure nothing

Each round runs every variant in each mode, the order of the variants rotating from round to
round, so that no variant always runs first while the box's speed drifts. A figure is the median
of its rounds; every round's value is printed beside it. A tool, not a test.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Sequence
from dataclasses import asdict, dataclass

import click

from bench.harness import broker_group
from bench.load import closed_loop, paced_loop, percentile, processes_cpu_s
from bench.nodeflags import NodeFlags
from client import ClientError, Message, Producer
from dledger.localcluster import LocalCluster
from dledger.node.runtime import MAX_BUSY_POLL_US

WARMUP = 200  # sends before anything is measured: the topic exists, connections are up
SETTLE_S = 1.0  # then this long, for the warm-up's replication and flushes to end

# What each variant's servers get (whatever the node's defaults): "off" neither option, "both"
# both; the busy-poll time comes from --busy-poll-us.
VARIANTS = ("off", "busy", "quorum-first", "both")

# (field, what it is, True if higher is better)
METRICS = (("idle_cpu_pct", "idle: CPU of the 3 nodes, % of a core", False),
           ("light_cpu_pct", "light load: CPU of the 3 nodes, % of a core", False),
           ("light_p50_ms", "light load: send p50 ms", False),
           ("one_p50_ms", "one producer: p50 ms", False),
           ("one_p99_ms", "one producer: p99 ms", False),
           ("one_cpu_s_per_10k", "one producer: CPU s / 10k msgs", False),
           ("concurrent_msgs_per_s", "64 concurrent: msgs/s", True),
           ("concurrent_cpu_s_per_10k", "64 concurrent: CPU s / 10k msgs", False))


@dataclass(frozen=True)
class Settings:
    payload_bytes: int = 1024
    busy_poll_us: int = 300
    idle_s: float = 20.0
    light_s: float = 20.0
    light_rate_per_s: float = 100.0
    one_count: int = 2000
    concurrent_count: int = 20_000


@dataclass
class Reading:
    round: int
    mode: str
    variant: str
    node_args: list[str]
    idle_cpu_pct: float
    light_cpu_pct: float
    light_p50_ms: float
    one_p50_ms: float
    one_p99_ms: float
    one_cpu_s_per_10k: float
    concurrent_msgs_per_s: float
    concurrent_cpu_s_per_10k: float


def variant_flags(variant: str, busy_poll_us: int) -> NodeFlags:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")
    return NodeFlags(busy_poll_us if variant in ("busy", "both") else 0,
                     variant in ("quorum-first", "both"))


def plan(repeats: int, modes: Sequence[str], variants: Sequence[str]) -> list[tuple[int, str, str]]:
    """The runs in order, as (round, mode, variant): in round r each mode runs every variant,
    starting from the r-th (with two variants: A B, then B A, ...)."""
    steps = []
    for r in range(repeats):
        k = r % len(variants)
        order = [*variants[k:], *variants[:k]]
        steps += [(r, mode, v) for mode in modes for v in order]
    return steps


def summarize(readings: Sequence[Reading]) -> list[dict[str, object]]:
    """Per (mode, metric): each variant's median over its rounds and every round's value (by
    round), and each variant's median against the first variant's (the baseline)."""
    variants = list(dict.fromkeys(r.variant for r in readings))
    modes = list(dict.fromkeys(r.mode for r in readings))
    out: list[dict[str, object]] = []
    for mode in modes:
        for name, what, higher_better in METRICS:
            by_variant = {v: sorted((r.round, float(getattr(r, name))) for r in readings
                                     if r.mode == mode and r.variant == v) for v in variants}
            medians = {v: statistics.median(x for _, x in vals) for v, vals in by_variant.items() if vals}
            base = medians.get(variants[0])
            out.append({"mode": mode, "metric": name, "what": what, "higher_is_better": higher_better,
                        "median": medians,
                        "rounds": {v: [x for _, x in vals] for v, vals in by_variant.items()},
                        "ratio": {v: m / base for v, m in medians.items() if base}})
    return out


def render(summary: Sequence[dict[str, object]], variants: Sequence[str]) -> str:
    head = f"{'mode':<6} {'metric':<44}" + "".join(f" {v:>12}" for v in variants)
    head += "".join(f" {v + '/' + variants[0]:>18}" for v in variants[1:]) + "  each round"
    lines = [head, "-" * len(head)]
    for row in summary:
        med, ratio, rounds = row["median"], row["ratio"], row["rounds"]
        assert isinstance(med, dict) and isinstance(ratio, dict) and isinstance(rounds, dict)
        cells = "".join(f" {med[v]:>12.2f}" if v in med else f" {'-':>12}" for v in variants)
        cells += "".join(f" {ratio[v]:>17.2f}x" if v in ratio else f" {'-':>18}" for v in variants[1:])
        each = " | ".join(" ".join(f"{x:.2f}" for x in rounds.get(v, [])) for v in variants)
        lines.append(f"{row['mode']:<6} {row['what']!s:<44}{cells}  {each}")
    return "\n".join(lines)


def cpu_pct(cpu_s: float, wall_s: float) -> float:
    """CPU seconds over wall seconds, as % of one core."""
    return cpu_s / wall_s * 100 if wall_s > 0 else float("nan")


async def _measure(ns: str, cluster: LocalCluster, s: Settings) -> dict[str, float]:
    pids = [srv.proc.pid for srv in cluster.servers.values() if srv.proc is not None]
    body = os.urandom(s.payload_bytes)
    async with Producer(ns, send_timeout_s=10) as p:
        def send() -> Awaitable[object]:
            return p.send(Message("flags", body))
        for _ in range(WARMUP):
            await send()
        await asyncio.sleep(SETTLE_S)
        cpu0, t0 = processes_cpu_s(pids), time.perf_counter()
        await asyncio.sleep(s.idle_s)  # idle: what the nodes burn with nothing to do
        idle = cpu_pct(processes_cpu_s(pids) - cpu0, time.perf_counter() - t0)
        cpu0 = processes_cpu_s(pids)
        lat, elapsed, _ = await paced_loop(send, s.light_rate_per_s, s.light_s, (ClientError,))
        light = cpu_pct(processes_cpu_s(pids) - cpu0, elapsed)
        light_p50 = percentile(sorted(lat), 50)
        out = {"idle_cpu_pct": idle, "light_cpu_pct": light, "light_p50_ms": light_p50}
        for key, count, k in (("one", s.one_count, 1), ("concurrent", s.concurrent_count, 64)):
            warmup = min(200, count // 5)
            cpu0 = processes_cpu_s(pids)
            lat, elapsed, _ = await closed_loop(send, count, k, warmup, failure=(ClientError,))
            cpu_per_10k = (processes_cpu_s(pids) - cpu0) / max(1, len(lat) + warmup) * 10_000
            lat.sort()
            out |= {f"{key}_p50_ms": percentile(lat, 50), f"{key}_p99_ms": percentile(lat, 99),
                    f"{key}_msgs_per_s": len(lat) / elapsed if elapsed else 0.0,
                    f"{key}_cpu_s_per_10k": cpu_per_10k}
    return out


def run_once(r: int, mode: str, variant: str, s: Settings) -> Reading:
    flags = variant_flags(variant, s.busy_poll_us)
    # the broker's default registration interval, so the idle figure is what a user's group burns
    with broker_group(mode, flags, register_interval_s=30.0) as (ns, cluster):
        m = asyncio.run(_measure(ns, cluster, s))
    return Reading(r, mode, variant, list(flags.args()),
                   **{name: round(m[name], 3) for name, _, _ in METRICS})


@click.command()
@click.option("--quick", is_flag=True, help="A smoke run of the tool (seconds per run; not a measurement).")
@click.option("--repeats", type=click.IntRange(1, 99), default=3, show_default=True,
              help="Rounds; each figure is the median of its rounds.")
@click.option("--modes", default="sync,async", show_default=True, help="Flush modes.")
@click.option("--variants", default="off,both", show_default=True,
              help=f"Node options compared, the first the baseline: {', '.join(VARIANTS)} "
                   "(busy: --busy-poll-us only; both: with --quorum-first).")
@click.option("--payload", "payload_bytes", type=click.IntRange(1, 4 << 20), default=1024, show_default=True)
@click.option("--busy-poll-us", type=click.IntRange(1, MAX_BUSY_POLL_US), default=300, show_default=True)
@click.option("--idle-s", type=click.FloatRange(1, 600), default=20.0, show_default=True)
@click.option("--light-s", type=click.FloatRange(1, 600), default=20.0, show_default=True)
@click.option("--light-rate", "light_rate_per_s", type=click.FloatRange(1, 10_000), default=100.0,
              show_default=True, help="Messages/s of the light load.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None)
def main(quick: bool, repeats: int, modes: str, variants: str, payload_bytes: int, busy_poll_us: int,
         idle_s: float, light_s: float, light_rate_per_s: float, json_path: str | None) -> None:
    """A broker group with and without --busy-poll-us/--quorum-first, alternating: idle and
    light-load CPU, one-producer p50, 64-concurrent rate (to decide the node defaults)."""
    mode_list = [m for m in modes.split(",") if m]
    variant_list = [v for v in variants.split(",") if v]
    for m in mode_list:
        if m not in ("sync", "async"):
            raise click.BadParameter(f"{m!r} is not a flush mode (sync, async)", param_hint="--modes")
    try:
        flags = {v: variant_flags(v, busy_poll_us) for v in variant_list}
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--variants") from err
    s = Settings(payload_bytes, busy_poll_us, idle_s, light_s, light_rate_per_s)
    if quick:
        s = Settings(payload_bytes, busy_poll_us, 2.0, 2.0, light_rate_per_s, 200, 2000)
    steps = plan(repeats, mode_list, variant_list)
    readings: list[Reading] = []
    with click.progressbar(steps, label="bench_flags", file=sys.stderr,
                           item_show_func=lambda x: f"round {x[0] + 1} {x[1]} {x[2]}" if x else "") as bar:
        for r, mode, variant in bar:
            readings.append(run_once(r, mode, variant, s))
    summary = summarize(readings)
    for v, f in flags.items():
        click.echo(f"{v}: {f.describe()}")
    click.echo(f"{payload_bytes} B, {repeats} round(s); median of the rounds, then each round's value"
               + (" (--quick: not a measurement)" if quick else ""))
    click.echo(render(summary, variant_list))
    if json_path:
        with open(json_path, "w") as out:
            json.dump({"settings": asdict(s), "quick": quick, "readings": [asdict(x) for x in readings],
                       "summary": summary, "cores": os.cpu_count(),
                       "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, out, indent=2)


if __name__ == "__main__":
    main()
