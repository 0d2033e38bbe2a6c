"""The benchmark's rounds: each row reports its median round, by the same rule for dledger and
for pysyncobj, and the targets show every round's ratio."""

from __future__ import annotations

from bench.log import Figure, median_figures, targets


def _inflight(system: str, mode: str, eps: float, p50_ms: float = 1.0) -> Figure:
    return Figure(system, mode, "in leader", "inflight", 128, 64, 1000, eps, p50_ms, 2 * p50_ms)


def _one(system: str, mode: str, p50_ms: float) -> Figure:
    return Figure(system, mode, "in leader", "one", 128, 1, 1000, 1 / p50_ms, p50_ms, 2 * p50_ms)


def test_each_row_is_its_median_round_with_every_rounds_headline() -> None:
    rounds = [[_inflight("dledger", "sync", 40_000, 1.5), _one("dledger", "sync", 0.50)],
              [_inflight("dledger", "sync", 20_000, 3.0), _one("dledger", "sync", 0.30)],
              [_inflight("dledger", "sync", 50_000, 1.2), _one("dledger", "sync", 0.90)]]
    many, one = median_figures(rounds)
    # the measured round with the median throughput, whole (its latencies come with it)
    assert (many.entries_per_s, many.p50_ms, many.rounds) == (40_000, 1.5, [40_000, 20_000, 50_000])
    # one at a time, the round with the median p50
    assert (one.p50_ms, one.rounds) == (0.50, [0.50, 0.30, 0.90])


def test_a_row_measured_in_fewer_rounds_takes_the_worse_middle_of_those() -> None:
    rounds = [[_inflight("dledger", "sync", 10_000), _one("dledger", "sync", 0.3)], [],
              [_inflight("dledger", "sync", 30_000), _one("dledger", "sync", 0.5)]]
    many, one = median_figures(rounds)
    # of two, the worse for the row itself: the lower rate, the higher p50
    assert many.entries_per_s == 10_000 and many.rounds == [10_000, None, 30_000]
    assert one.p50_ms == 0.5 and one.rounds == [0.3, None, 0.5]


def test_each_rounds_ratio_pairs_the_same_round_of_both_systems() -> None:
    rounds = [[_inflight("dledger", "sync", 50_000)],
              [_inflight("dledger", "sync", 60_000), _inflight("pysyncobj 0.3.17", "memory", 10_000)],
              [_inflight("pysyncobj 0.3.17", "memory", 12_000)]]
    ((text, _),) = targets(median_figures(rounds))
    assert text.endswith("(each round: -, 6.00x, -)")


def test_targets_are_judged_on_the_medians_and_show_each_round() -> None:
    rounds = [[_inflight("dledger", "sync", 45_000), _inflight("pysyncobj 0.3.17", "memory", 10_000)],
              [_inflight("dledger", "sync", 30_000), _inflight("pysyncobj 0.3.17", "memory", 5_000)],
              [_inflight("dledger", "sync", 60_000), _inflight("pysyncobj 0.3.17", "memory", 8_000)]]
    ((text, met),) = targets(median_figures(rounds))
    # medians 45,000 / 8,000 = 5.62x, though the first round alone was 4.50x
    assert met and text.startswith("128 B: 64 in flight, sync: 5.62x")
    assert text.endswith("(each round: 4.50x, 6.00x, 7.50x)")
    ((text, met),) = targets(median_figures(rounds[1:2]))  # one round: no per-round list
    assert met and text.endswith("target >= 5x")
