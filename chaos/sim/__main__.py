"""Command line of the simulator.

    python -m chaos.sim --seeds 0-999 --nodes 3,5          # a sweep
    python -m chaos.sim --seed 17 --nodes 5                # replay one seed, print its report
    python -m chaos.sim --seeds 0-49 --canary forget_vote  # prove a checker fires
"""

from __future__ import annotations

import sys

import click

from chaos.sim.runner import CANARIES, run_seed, sweep


def _parse_seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    return out


@click.command()
@click.option("--seed", type=int, default=None, help="Replay one seed and print its full report.")
@click.option("--seeds", default="0-99", show_default=True, help="Seeds to sweep, e.g. 0-999 or 1,5,9.")
@click.option("--nodes", default="3,5", show_default=True, help="Group sizes, comma separated.")
@click.option("--canary", type=click.Choice(sorted(CANARIES)), default=None,
              help="Run with a seeded bug; the sweep must find a violation.")
@click.option("--budget-s", type=float, default=600.0, show_default=True,
              help="Stop starting new seeds after this many seconds.")
@click.option("--workers", type=int, default=2, show_default=True)
def main(seed: int | None, seeds: str, nodes: str, canary: str | None, budget_s: float,
         workers: int) -> None:
    sizes = [int(n) for n in nodes.split(",") if n]
    if seed is not None:
        for size in sizes:
            r = run_seed(seed, size, canary)
            click.echo(r.report())
            if not r.ok and canary is None:
                sys.exit(1)
        return
    jobs = [(s, size, canary) for s in _parse_seeds(seeds) for size in sizes]
    summary = sweep(jobs, budget_s, workers, stop_on_failure=canary is not None)
    for r in summary.failures[:5]:
        click.echo(r.report())
    click.echo(summary.line())
    if canary is None and summary.failures:
        sys.exit(1)
    if canary is not None and not summary.failures:
        click.echo(f"canary {canary} was NOT caught")
        sys.exit(1)


if __name__ == "__main__":
    main()
