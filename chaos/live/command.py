"""``dledger chaos run``: runs live chaos scenarios (and canaries), prints progress, the seed and
the fault timeline as they happen, and writes the report (markdown, JSON, one PNG per run).
Exits 1 when a run did not end as expected (a scenario with a safety violation, a canary that
was not caught). Also ``python -m chaos.live run ...``."""

from __future__ import annotations

import asyncio
import os
import platform
import subprocess
import sys
import time
from typing import Any

import click

from chaos.live.canaries import CANARIES
from chaos.live.features.driver import BROKER_CANARIES as FEATURE_CANARIES
from chaos.live.nemesis import CI_SUBSET, SCENARIOS
from chaos.live.report.writer import write_report
from chaos.live.runner import RunConfig, run_scenario

FEATURE_SCENARIOS = [name for name, sc in SCENARIOS.items() if sc.features]


def _meta(tick_ms: int, election_ticks: int) -> dict[str, Any]:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    election_ms = tick_ms * election_ticks
    return {"commit": commit or "unknown", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "python": platform.python_version(), "kernel": platform.release(),
            "cores": os.cpu_count() or 0, "tick_ms": tick_ms, "election_ticks": election_ticks,
            "heartbeat_ms": tick_ms, "election_timeout_ms": [election_ms, 2 * election_ms],
            "command": " ".join(["dledger chaos run",
                                 *sys.argv[sys.argv.index("run") + 1 if "run" in sys.argv else 1:]])}


def plan(scenarios: tuple[str, ...], all_: bool, ci: bool, canaries: tuple[str, ...],
         all_canaries: bool) -> list[tuple[str, str | None]]:
    names = list(SCENARIOS) if all_ else list(CI_SUBSET) if ci else list(scenarios)
    runs: list[tuple[str, str | None]] = [(n, None) for n in names]
    for c in (list(CANARIES) if all_canaries else list(canaries)):
        runs.append((CANARIES[c][0], c))
    return runs


@click.group()
def chaos() -> None:
    """Live chaos scenarios on real processes (docs/testing.md)."""


@chaos.command("run")
@click.option("--scenario", "scenarios", multiple=True, type=click.Choice(list(SCENARIOS)),
              help="A scenario to run (repeatable).")
@click.option("--all", "all_", is_flag=True, help="Every scenario.")
@click.option("--ci", is_flag=True, help=f"The CI subset: {', '.join(CI_SUBSET)}.")
@click.option("--canary", "canaries", multiple=True, type=click.Choice(list(CANARIES)),
              help="Also run this seeded bug in its scenario (it must be caught).")
@click.option("--canaries", "all_canaries", is_flag=True, help="Run every canary.")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--duration", "duration_s", type=float, default=120.0, show_default=True,
              help="Seconds of faults per scenario.")
@click.option("--out", "out_dir", default="chaos-report", show_default=True,
              type=click.Path(file_okay=False), help="Report directory.")
@click.option("--work-dir", default=None, type=click.Path(file_okay=False),
              help="Data, logs and histories (default: <out>/work).")
@click.option("--keep-data", is_flag=True, help="Keep the brokers' data of passing runs too.")
@click.option("--features/--no-features", default=None,
              help="Run the messaging features (delayed, ordered, retried, transactional "
                   "messages) and their checkers beside the workload"
                   f" [default: in {', '.join(FEATURE_SCENARIOS)}; "
                   "a feature canary needs them].")
@click.option("--tls", "use_tls", is_flag=True, envvar="DLEDGER_CHAOS_TLS",
              help="TLS on every listener and mutual TLS on peer links, through the same "
                   "proxies (a test CA per run; docs/tls.md).")
def run(scenarios: tuple[str, ...], all_: bool, ci: bool, canaries: tuple[str, ...],
        all_canaries: bool, seed: int, duration_s: float, out_dir: str, work_dir: str | None,
        keep_data: bool, features: bool | None, use_tls: bool) -> None:
    """Run scenarios and write a report; exit 1 if any run did not end as expected."""
    todo = plan(scenarios, all_, ci, canaries, all_canaries)
    if not todo:
        raise click.UsageError("name a --scenario, or --all, --ci, --canary, --canaries")
    click.echo(f"chaos: {len(todo)} run(s), seed {seed}, {duration_s:g} s of faults each")
    results = []
    for name, canary in todo:
        cfg = RunConfig(name, seed, duration_s, work_dir or os.path.join(out_dir, "work"),
                        canary, keep_data=keep_data,
                        features=True if canary in FEATURE_CANARIES else features, tls=use_tls)
        results.append(asyncio.run(run_scenario(cfg, say=lambda s: click.echo(s))))
    path = write_report(results, _meta(100, 10), out_dir)
    unexpected = [f"{r['scenario']}{'/' + r['canary'] if r['canary'] else ''}" for r in results
                  if (r["verdict"] == "FAIL") != (r["expect"] == "fail")]
    click.echo(f"chaos: report in {path}")
    if unexpected:
        click.echo(f"chaos: NOT as expected: {', '.join(unexpected)}")
        sys.exit(1)
    click.echo(f"chaos: all {len(results)} run(s) as expected")


def main() -> None:
    chaos()
