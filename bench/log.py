"""The replicated-log benchmark: a 3-process dledger group on loopback against pysyncobj 0.3.17
(3 processes, the same payload, a replicated append), side by side in one run.

    python -m bench.log                       # full run: 128 B and 1 KiB, both flush modes
    python -m bench.log --quick               # a short smoke run
    python -m bench.log --json out.json       # also save the figures
    python -m bench.log --repeats 5           # each row the median of 5 alternating runs

Workloads (docs/performance.md): "one" = one proposer awaiting each commit; "inflight" = 64 proposers in
flight for dledger, 1,000 calls in flight for pysyncobj (its best case). Prints a table with
ratios to pysyncobj and checks the targets of the replicated-log issue. It also measures the
disk (one entry's write and fdatasync with 1, 2 and 3 processes flushing at once, see
``bench.disk``) and prints, for the ``sync`` one-proposer rows, what two concurrent
flushes leave of the target and an estimate of the best to expect. A tool, not a test.

The box is shared and its speed drifts within minutes, and a drift that hits one system's run and
not the other's moves a ratio. So the whole plan runs ``--repeats`` times (3 by default, odd),
each round alternating dledger's groups and pysyncobj's as in one plan, and every row reports the
round whose headline figure is the median of its rounds (entries/s for ``inflight``, p50 for
``one``): the same rule for both systems. The targets are judged on those medians; the ratio of
each round is printed beside them, so that the spread shows.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import click

from bench.disk import FlushFigure, measure_flushes, sync_estimate_ms
from bench.load import closed_loop, percentile, processes_cpu_s
from bench.nodeflags import NodeFlags, node_flag_options
from bench.pysyncobj_peer import run_pysyncobj
from dledger import evloop
from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from protocol.envelope import LOCAL_LOAD

# The benchmark's node options unless told otherwise: the node's own defaults, as `dledger bench`
# runs (--busy-poll-us 300 and --quorum-first since both became the node's defaults).
BENCH_FLAGS = NodeFlags()


@dataclass
class Figure:
    system: str
    mode: str
    proposer: str  # "in leader" (like pysyncobj's driver) or "client" (another process, TCP)
    workload: str
    payload_bytes: int
    in_flight: int
    entries: int
    entries_per_s: float
    p50_ms: float
    p99_ms: float
    failures: int = 0
    cpu_s_per_10k: float | None = None
    rounds: list[float | None] = field(default_factory=list)  # headline per round (None: not run)

    @property
    def key(self) -> tuple[str, str, str, str, int]:
        return (self.system, self.mode, self.proposer, self.workload, self.payload_bytes)

    @property
    def headline(self) -> float:
        """What a round is judged by: throughput under load, latency one at a time."""
        return self.entries_per_s if self.workload == "inflight" else self.p50_ms

    @property
    def goodness(self) -> float:
        """The headline as higher-is-better (a p50 negated), for ranking rounds."""
        return self.headline if self.workload == "inflight" else -self.headline


def median_figures(rounds: Sequence[Sequence[Figure]]) -> list[Figure]:
    """One figure per row: of the rounds that measured it, the one whose headline figure is
    the median (an odd number of rounds: the median is a measured run, not a blend; of an even
    number, the worse of the two middle ones, for every system alike), with each round's
    headline in ``rounds`` by round number (None where the row was not measured). Rows keep
    the order in which they first appear."""
    by_key: dict[tuple[str, str, str, str, int], dict[int, Figure]] = {}
    for k, figs in enumerate(rounds):
        for f in figs:
            by_key.setdefault(f.key, {})[k] = f
    out = []
    for group in by_key.values():
        ranked = sorted(group.values(), key=lambda f: f.goodness)
        headlines = [group[k].headline if k in group else None for k in range(len(rounds))]
        out.append(replace(ranked[(len(ranked) - 1) // 2], rounds=headlines))
    return out


def _figure(mode: str, proposer: str, workload: str, size: int, in_flight: int,
            lat: list[float], elapsed: float, failures: int, cpu_s: float) -> Figure:
    lat = sorted(lat)
    return Figure("dledger", mode, proposer, workload, size, in_flight, len(lat),
                  len(lat) / elapsed if elapsed else 0.0, percentile(lat, 50), percentile(lat, 99), failures,
                  round(cpu_s / max(1, len(lat)) * 10_000, 3))


async def _session(cluster: LocalCluster, mode: str, size: int,
                   runs: list[tuple[str, str, int, int]]) -> list[Figure]:
    """Several workloads against one running group: (proposer, workload, count, in_flight)."""
    figs = []
    payload = os.urandom(size)
    async with LogClient(cluster.client_addresses, timeout_s=10.0) as client:
        leader = await client.wait_for_leader(30)
        for proposer, workload, count, in_flight in runs:
            warmup = min(2000, max(200, count // 5))
            cpu0 = _servers_cpu_s(cluster)
            if proposer == "in leader":
                r = await client.call(leader, LOCAL_LOAD, size, count, in_flight, warmup,
                                      timeout_s=300)
                lat, elapsed, failures = r["latencies_ms"], r["elapsed_s"], r["failures"]
            else:
                lat, elapsed, failures = await closed_loop(lambda: client.propose(payload), count,
                                                           in_flight, warmup)
            cpu = _servers_cpu_s(cluster) - cpu0
            figs.append(_figure(mode, proposer, workload, size, in_flight, lat, elapsed, failures, cpu))
    return figs


def _servers_cpu_s(cluster: LocalCluster) -> float:
    """CPU seconds used so far by the group's server processes (user + system)."""
    return processes_cpu_s([s.proc.pid for s in cluster.servers.values() if s.proc is not None])


def run_dledger(mode: str, size: int, runs: list[tuple[str, str, int, int]],
                flags: NodeFlags = BENCH_FLAGS) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="dledger-bench-") as d:
        args = ("--enable-bench", *flags.args())
        with LocalCluster(d, size=3, flush_mode=mode, extra_args=args) as cluster:
            return evloop.run(_session(cluster, mode, size, runs))


def run_peer(workload: str, payload_bytes: int, count: int, in_flight: int,
             malloc: str = "tuned") -> Figure:
    r = run_pysyncobj(workload, payload_bytes, count, inflight=in_flight, malloc=malloc)
    return Figure("pysyncobj 0.3.17", "memory", "in leader", workload, payload_bytes, in_flight,
                  int(r["entries"]), float(r["entries_per_s"]), float(r["p50_ms"]),
                  float(r["p99_ms"]), int(r.get("failures", 0)),
                  round(float(r.get("cpu_s", 0.0)) / max(1, int(r["entries"])) * 10_000, 3))


# -- the run ------------------------------------------------------------------------------------------


def plan(quick: bool, payloads: list[int]) -> list[tuple[Any, ...]]:
    """Steps in run order: ("dledger", mode, size, runs), ("pysyncobj", workload, size, n, k) or
    ("pysyncobj-default-malloc", "one", size, n, 1) (the same peer with glibc's defaults)."""
    one_n, many_n, peer_many_n = (300, 3000, 5000) if quick else (2000, 30_000, 30_000)
    runs = [("in leader", "one", one_n, 1), ("client", "one", one_n, 1),
            ("in leader", "inflight", many_n, 64), ("client", "inflight", many_n, 64)]
    steps: list[tuple[Any, ...]] = []
    for size in payloads:
        steps += [("pysyncobj", "one", size, one_n, 1),
                  ("pysyncobj-default-malloc", "one", size, one_n, 1),
                  ("dledger", "sync", size, runs),
                  ("dledger", "async", size, runs),
                  ("pysyncobj", "inflight", size, peer_many_n, 1000)]
    return steps


def render(figs: list[Figure]) -> str:
    peer = {(f.workload, f.payload_bytes): f for f in figs if f.system.startswith("pysyncobj")}
    head = (f"{'workload':<9} {'payload':>7} {'system':<17} {'mode':<6} {'proposer':<9} "
            f"{'in flight':>9} {'entries/s':>10} {'p50 ms':>7} {'p99 ms':>7} {'cpu s/10k':>9} "
            f"{'x peer/s':>8} {'p50/peer':>8}")
    rows = [head, "-" * len(head)]
    order = sorted(figs, key=lambda f: (f.payload_bytes, f.workload, f.system != "dledger",
                                        f.mode, f.proposer))
    for f in order:
        p = peer.get((f.workload, f.payload_bytes))
        tput = f"{f.entries_per_s / p.entries_per_s:.2f}" if p and p is not f and p.entries_per_s else ""
        lat = f"{f.p50_ms / p.p50_ms:.2f}" if p and p is not f and p.p50_ms else ""
        rows.append(f"{f.workload:<9} {f.payload_bytes:>7} {f.system:<17} {f.mode:<6} "
                    f"{f.proposer:<9} {f.in_flight:>9} {f.entries_per_s:>10.0f} {f.p50_ms:>7.2f} "
                    f"{f.p99_ms:>7.2f} {f.cpu_s_per_10k or 0:>9.2f} {tput:>8} {lat:>8}")
    return "\n".join(rows)


def _in_leader(figs: list[Figure], size: int) -> dict[tuple[str, str, str], Figure]:
    """The like-for-like rows of one payload, by (system, mode, workload)."""
    return {(f.system.split()[0], f.mode, f.workload): f for f in figs
            if f.payload_bytes == size and f.proposer == "in leader"}


def _per_round(ours: Figure, peer: Figure) -> str:
    """Each round's ratio of the two rows' headline figures, when there were several rounds."""
    if len(ours.rounds) < 2 or len(ours.rounds) != len(peer.rounds):
        return ""
    ratios = ", ".join(f"{a / b:.2f}x" if a is not None and b else "-"
                       for a, b in zip(ours.rounds, peer.rounds))
    return f" (each round: {ratios})"


def targets(figs: list[Figure]) -> list[tuple[str, bool]]:
    """The issue's targets, on the like-for-like rows (proposers inside the leader process)."""
    out = []
    for size in sorted({f.payload_bytes for f in figs}):
        get = _in_leader(figs, size)
        peer_many = get.get(("pysyncobj", "memory", "inflight"))
        ours_many = get.get(("dledger", "sync", "inflight"))
        if peer_many and ours_many:
            r = ours_many.entries_per_s / peer_many.entries_per_s
            out.append((f"{size} B: 64 in flight, sync: {r:.2f}x pysyncobj's entries/s "
                        f"(1,000 in flight); target >= 5x{_per_round(ours_many, peer_many)}",
                        r >= 5))
        peer_one = get.get(("pysyncobj", "memory", "one"))
        for mode, bound in (("async", 1.0), ("sync", 2.0)):
            ours = get.get(("dledger", mode, "one"))
            if peer_one and ours:
                r = ours.p50_ms / peer_one.p50_ms
                out.append((f"{size} B: one proposer, {mode}: p50 {r:.2f}x pysyncobj's; "
                            f"target <= {bound:g}x{_per_round(ours, peer_one)}", r <= bound))
    return out


def default_malloc_lines(figs: list[Figure], shipped: list[Figure]) -> list[str]:
    """The one-proposer comparison again, with pysyncobj on glibc's default allocator settings
    (the table's pysyncobj keeps freed memory: its best case, see pysyncobj_peer)."""
    out = []
    for d in shipped:
        get = _in_leader(figs, d.payload_bytes)
        tuned = get.get(("pysyncobj", "memory", "one"))
        ours = {mode: get.get(("dledger", mode, "one")) for mode in ("async", "sync")}
        ratios = ", ".join(f"{mode} {f.p50_ms / d.p50_ms:.2f}x" for mode, f in ours.items() if f)
        out.append(f"{d.payload_bytes} B: pysyncobj with glibc's default malloc, one proposer: p50 "
                   f"{d.p50_ms:.3f} ms (kept memory: {tuned.p50_ms if tuned else float('nan'):.3f} ms)"
                   f"; dledger's one-proposer p50 against it: {ratios}")
    return out


def cpu_probe_us() -> float:
    """How fast this machine runs Python now: the best of five timings of ``sum(range(1000))``
    (in µs). Shared machines drift during a run (8.2 to 14.4 µs on the 2-core box within one
    hour); printed at the start and the end so a run can be read against the machine's state."""
    best = float("inf")
    for _ in range(6):  # the first round warms up (the CPU may just have woken)
        t0 = time.perf_counter()
        for _ in range(10_000):
            sum(range(1000))
        best = min(best, (time.perf_counter() - t0) / 10_000 * 1e6)
    return best


def measure_disk(quick: bool, payloads: list[int]) -> list[FlushFigure]:
    count = 100 if quick else 500
    return [measure_flushes(size, writers, count) for size in payloads for writers in (1, 2, 3)]


def render_disk(disk: list[FlushFigure]) -> str:
    rows = [f"{'payload':>7} {'writers':>7} {'fdatasync p50 ms':>16} {'p99 ms':>7}"]
    rows += [f"{d.payload_bytes:>7} {d.writers:>7} {d.p50_ms:>16.3f} {d.p99_ms:>7.3f}"
             for d in disk]
    return "\n".join(rows)


def sync_estimates(figs: list[Figure], disk: list[FlushFigure]) -> list[str]:
    """For each payload, what this disk leaves of the ``sync`` one-proposer target. A commit
    waits for two replicas' fdatasyncs of one disk at once (the third replica flushes too, so
    the two-writer figure is the hopeful one); the rest of the 2x budget is for the round trip.
    Adding the ``async`` round trip gives an estimate of the best p50 to expect, not a bound."""
    out = []
    for size in sorted({f.payload_bytes for f in figs}):
        get = _in_leader(figs, size)
        peer, ours = get.get(("pysyncobj", "memory", "one")), get.get(("dledger", "async", "one"))
        two = next((d for d in disk if d.payload_bytes == size and d.writers == 2), None)
        if peer and ours and two:
            disk_x, trip_x = two.p50_ms / peer.p50_ms, ours.p50_ms / peer.p50_ms
            out.append(f"{size} B: one proposer, sync: two-writer fdatasync p50 "
                       f"{two.p50_ms:.3f} ms is {disk_x:.2f}x pysyncobj's p50, leaving "
                       f"{2 - disk_x:.2f}x of the 2x target for the round trip (async p50 "
                       f"{trip_x:.2f}x): estimated best about "
                       f"{sync_estimate_ms(ours.p50_ms, two) / peer.p50_ms:.2f}x")
    return out


def write_markdown(path: str, figs: list[Figure], command: str,
                   disk: list[FlushFigure], shipped: list[Figure],
                   probe_us: Sequence[float] = (), repeats: int = 1,
                   flags: NodeFlags = BENCH_FLAGS) -> None:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        "# Replicated-log benchmark: dledger vs pysyncobj 0.3.17", "",
        f"Measured {when} on {os.cpu_count()} cores, {platform.python_implementation()} "
        f"{platform.python_version()}, one run, with `{command}`"
        + (f": each row is the median of {repeats} rounds of the whole plan, dledger's and "
           "pysyncobj's runs alternating in each round (the round with the median entries/s "
           "for `inflight`, the median p50 for `one`; the same rule for both systems), and each "
           "target also shows the ratio of every round." if repeats > 1 else "."), "",
        "Rows marked `in leader` run the proposers inside the leader process (pysyncobj has no "
        "network client, so that is how it is driven), each commit's callback submitting the next "
        "proposal in both systems; `client` rows propose from a separate "
        "process over TCP. `x peer/s` and `p50/peer` are ratios to pysyncobj on the same "
        "workload and payload. pysyncobj keeps its log in memory and never fsyncs; dledger `sync` "
        "fsyncs on a majority before every acknowledgement. `cpu s/10k`: CPU seconds of the three "
        "server processes per 10,000 entries (for `one`, idle time is included). pysyncobj runs "
        "with its fastest setting per workload (appendEntriesUseBatch off for `one`, on for "
        "`inflight`), and with glibc told to keep freed memory (with glibc's defaults each "
        "message's zlib state is handed back to the kernel; on this box that made one-at-a-time "
        "calls about three times slower: see below and bench/pysyncobj_peer.py). "
        "dledger's servers run on uvloop, with a leader's background fsyncs through Linux AIO (a "
        f"follower fsyncs a batch with a plain fdatasync), with {flags.prose()}.", "",
        f"dledger's {flags.describe()}.", "",
        "```", render(figs), "```", ""]
    if len(probe_us) == 2:
        lines += [f"Python speed probe (`sum(range(1000))`, best of five): {probe_us[0]:.2f} µs "
                  f"at the start of the run, {probe_us[1]:.2f} µs at the end.", ""]
    lines += ["Targets of the replicated-log issue:", ""]
    lines += [f"- {'met' if ok else '**missed**'}: {text}" for text, ok in targets(figs)]
    lines += ["", "The same peer with glibc's default allocator settings, in the same run:", ""]
    lines += [f"- {text}" for text in default_malloc_lines(figs, shipped)]
    lines += ["", "The disk, measured in the same run (one entry's write and fdatasync in a file of "
              "its own per process, written in place into zeros as the commitlog does, all "
              "processes flushing at once; the replicas of a local group share this disk):",
              "", "```", render_disk(disk), "```", ""]
    lines += [f"- {text}" for text in sync_estimates(figs, disk)]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


@click.command()
@click.option("--quick", is_flag=True, help="Short run (smoke test of the tool).")
@click.option("--payloads", default="128,1024", show_default=True)
@click.option("--repeats", type=click.IntRange(1, 99), default=None,
              help="Rounds of the whole plan, odd; each row reports its median round "
                   "[default: 3, or 1 with --quick].")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None)
@click.option("--markdown", "md_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the table and targets as markdown (e.g. docs/bench.md).")
@node_flag_options(BENCH_FLAGS.busy_poll_us, BENCH_FLAGS.quorum_first)
def main(quick: bool, payloads: str, repeats: int | None, json_path: str | None,
         md_path: str | None, busy_poll_us: int, quorum_first: bool) -> None:
    sizes = [int(p) for p in payloads.split(",") if p]
    flags = NodeFlags(busy_poll_us, quorum_first)
    repeats = repeats if repeats is not None else (1 if quick else 3)
    if repeats % 2 == 0:
        raise click.BadParameter(f"{repeats} is even: the median must be one of the rounds",
                                 param_hint="--repeats")
    steps = plan(quick, sizes)
    rounds: list[list[Figure]] = [[] for _ in range(repeats)]
    shipped_rounds: list[list[Figure]] = [[] for _ in range(repeats)]  # glibc's default malloc
    probe_us = [cpu_probe_us()]
    disk = measure_disk(quick, sizes)
    click.echo(f"dledger bench: {repeats} x {len(steps)} runs on "
               f"{platform.python_implementation()} {platform.python_version()}, "
               f"{os.cpu_count()} cores; dledger's {flags.describe()}", err=True)
    work = [(k, step) for k in range(repeats) for step in steps]
    with click.progressbar(work, label="running", file=sys.stderr,
                           item_show_func=lambda w: f"round {w[0] + 1}: {w[1][0]} {w[1][1]} "
                                                    f"{w[1][2]} B" if w else "") as bar:
        for k, step in bar:
            if step[0] == "dledger":
                rounds[k].extend(run_dledger(step[1], step[2], step[3], flags))
            elif step[0] == "pysyncobj-default-malloc":
                shipped_rounds[k].append(run_peer(step[1], step[2], step[3], step[4],
                                                  malloc="default"))
            else:
                rounds[k].append(run_peer(step[1], step[2], step[3], step[4]))
    figs, shipped = median_figures(rounds), median_figures(shipped_rounds)
    probe_us.append(cpu_probe_us())
    if repeats > 1:
        click.echo(f"each row: the median of {repeats} rounds (entries/s for inflight, p50 for one)")
    click.echo(f"dledger's {flags.describe()}")
    click.echo(render(figs))
    click.echo(f"python speed probe, sum(range(1000)): {probe_us[0]:.2f} us at the start, "
               f"{probe_us[1]:.2f} us at the end")
    click.echo("")
    for text, ok in targets(figs):
        click.echo(f"  [{'met' if ok else 'MISSED'}] {text}")
    for text in default_malloc_lines(figs, shipped):
        click.echo(f"  [peer] {text}")
    click.echo("")
    click.echo(render_disk(disk))
    for text in sync_estimates(figs, disk):
        click.echo(f"  [disk] {text}")
    if md_path:
        write_markdown(md_path, figs, " ".join(["python -m bench.log", *sys.argv[1:]]), disk,
                       shipped, probe_us, repeats, flags)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"figures": [asdict(x) for x in figs], "node_options": asdict(flags),
                       "node_args": list(flags.args()),
                       "targets": [{"target": t, "met": ok} for t, ok in targets(figs)],
                       "peer_default_malloc": [asdict(x) for x in shipped],
                       "disk": [asdict(d) for d in disk], "disk_sync_estimates": sync_estimates(figs, disk),
                       "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                                   "python_speed_probe_us": probe_us, "repeats": repeats,
                                   "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}},
                      f, indent=2)


if __name__ == "__main__":
    main()
