"""Issue 16, item 23: both benchmarks can start their servers with or without --busy-poll-us and
--quorum-first and say which; the measurement tool that decides the defaults alternates its
variants and reports medians against the baseline."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from bench.flags import METRICS, Reading, plan, render, summarize, variant_flags
from bench.log import main as log_bench
from bench.nodeflags import NODE_BUSY_POLL_US, NODE_QUORUM_FIRST, NodeFlags, node_flag_options
from cli import main as dledger
from dledger.localcluster import LocalCluster
from dledger.node_cli import node_config, node_options


def test_node_flags_default_to_what_a_node_started_without_them_runs_with() -> None:
    seen = []

    @click.command()
    @node_options
    def node(**opts: object) -> None:
        seen.append(node_config(opts))

    assert CliRunner().invoke(node, ["--group", "g", "--id", "n0", "--peers", "n0=127.0.0.1:1",
                                     "--data-dir", "d"]).exit_code == 0
    assert (seen[0].busy_poll_us, seen[0].quorum_first) == (NODE_BUSY_POLL_US, NODE_QUORUM_FIRST)
    assert NodeFlags() == NodeFlags(NODE_BUSY_POLL_US, NODE_QUORUM_FIRST)
    assert NodeFlags().args() == ()
    assert NodeFlags().describe().startswith("node options: none (the node's defaults); busy polling")


def test_node_flags_give_the_node_arguments_and_say_which_ran() -> None:
    off, both = NodeFlags(0, False), NodeFlags(300, True)
    assert off.args(node=(0, False)) == ()
    assert both.args(node=(0, False)) == ("--busy-poll-us", "300", "--quorum-first")
    # were the node's defaults on, turning them off would be said, not left out
    assert off.args(node=(300, True)) == ("--busy-poll-us", "0", "--no-quorum-first")
    assert both.args(node=(300, True)) == ()
    assert NodeFlags(50, False).args(node=(300, False)) == ("--busy-poll-us", "50")
    assert both.describe().endswith("busy polling 300 us, quorum-first on")
    assert off.describe().endswith("busy polling 0 us, quorum-first off")
    assert "`--busy-poll-us 300`" in both.prose()
    assert "without `--quorum-first`" in NodeFlags(300, False).prose()
    command = LocalCluster("/nonexistent", extra_args=("--x", *both.args())).command("n0")
    assert command[-len(both.args()) - 1:] == ["--x", *both.args()]  # not started
    with pytest.raises(ValueError, match="busy_poll_us"):
        NodeFlags(-1)


def test_both_benchmarks_take_the_node_options_with_their_own_defaults() -> None:
    seen: list[NodeFlags] = []

    @click.command()
    @node_flag_options(busy_poll_us=300, quorum_first=True)
    def probe(busy_poll_us: int, quorum_first: bool) -> None:
        seen.append(NodeFlags(busy_poll_us, quorum_first))

    runner = CliRunner()
    for argv in ([], ["--no-quorum-first", "--busy-poll-us", "0"], ["--busy-poll-us", "50"]):
        assert runner.invoke(probe, argv).exit_code == 0
    assert seen == [NodeFlags(300, True), NodeFlags(0, False), NodeFlags(50, True)]
    assert runner.invoke(probe, ["--busy-poll-us", "-5"]).exit_code == 2  # a named usage error
    broker = runner.invoke(dledger, ["bench", "--help"]).output
    log = runner.invoke(log_bench, ["--help"]).output
    assert "--busy-poll-us" in broker and "--quorum-first / --no-quorum-first" in broker
    assert "--topics" in broker and f"default: {NODE_BUSY_POLL_US}" in broker  # the node's defaults
    assert "--busy-poll-us" in log and "default: quorum-first" in log  # as the log bench ran


def test_the_node_defaults_are_the_measured_ones_and_both_benchmarks_run_with_them() -> None:
    """Decided from `python -m bench.flags` (docs/performance.md): a node started from
    the command line busy-polls 300 us and replicates quorum first; both benchmarks start their
    servers with no option of their own, i.e. as a user's node runs."""
    from bench.log import BENCH_FLAGS

    assert (NODE_BUSY_POLL_US, NODE_QUORUM_FIRST) == (300, True)
    assert NodeFlags() == BENCH_FLAGS and BENCH_FLAGS.args() == ()
    runner = CliRunner()
    for help_text in (runner.invoke(dledger, ["bench", "--help"]).output,
                      runner.invoke(log_bench, ["--help"]).output):
        assert "[default: 300;" in help_text and "[default: quorum-first]" in help_text


def test_variants_are_named_node_options() -> None:
    assert variant_flags("off", 300) == NodeFlags(0, False)
    assert variant_flags("busy", 300) == NodeFlags(300, False)
    assert variant_flags("quorum-first", 300) == NodeFlags(0, True)
    assert variant_flags("both", 200) == NodeFlags(200, True)
    with pytest.raises(ValueError, match="unknown variant 'fast'"):
        variant_flags("fast", 300)


def test_the_plan_alternates_which_variant_runs_first() -> None:
    steps = plan(3, ["sync", "async"], ["off", "both"])
    assert steps == [(0, "sync", "off"), (0, "sync", "both"),
                     (0, "async", "off"), (0, "async", "both"),
                     (1, "sync", "both"), (1, "sync", "off"),
                     (1, "async", "both"), (1, "async", "off"),
                     (2, "sync", "off"), (2, "sync", "both"),
                     (2, "async", "off"), (2, "async", "both")]
    three = plan(3, ["sync"], ["a", "b", "c"])
    assert [v for _, _, v in three] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def _reading(r: int, variant: str, p50_ms: float, idle_pct: float) -> Reading:
    values = {name: 1.0 for name, _, _ in METRICS} | {"one_p50_ms": p50_ms, "idle_cpu_pct": idle_pct}
    return Reading(r, "sync", variant, [], **values)


def test_the_summary_is_each_variants_median_against_the_baseline() -> None:
    readings = [_reading(0, "off", 0.80, 1.0), _reading(0, "both", 0.40, 3.0),
                _reading(1, "both", 0.90, 2.0), _reading(1, "off", 0.70, 1.5),
                _reading(2, "off", 1.20, 0.5), _reading(2, "both", 0.48, 2.5)]
    rows = {row["metric"]: row for row in summarize(readings)}
    p50 = rows["one_p50_ms"]
    assert p50["median"] == {"off": 0.80, "both": 0.48}
    assert p50["rounds"] == {"off": [0.80, 0.70, 1.20], "both": [0.40, 0.90, 0.48]}
    assert p50["ratio"] == {"off": 1.0, "both": pytest.approx(0.6)}
    assert rows["idle_cpu_pct"]["ratio"]["both"] == pytest.approx(2.5)  # 2.5 % against 1.0 %
    table = render(summarize(readings), ["off", "both"]).splitlines()
    line = next(x for x in table if "one producer: p50 ms" in x)
    assert "0.80" in line and "0.48" in line and "0.60x" in line
    assert line.endswith("0.80 0.70 1.20 | 0.40 0.90 0.48")
