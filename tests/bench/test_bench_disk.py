"""The benchmark's disk probe and its report (figures are printed by the benchmark, not asserted:
these tests check the bookkeeping, not the speed)."""

from __future__ import annotations

import multiprocessing
import os
import sys

import pytest

from bench.disk import (
    FlushFigure,
    FlushProbeError,
    _next_result,
    flush_loop,
    measure_flushes,
    sync_estimate_ms,
)
from bench.log import Figure, render_disk, sync_estimates, targets, write_markdown


def _one(system: str, mode: str, size: int, p50_ms: float) -> Figure:
    return Figure(system, mode, "in leader", "one", size, 1, 1000, 1 / p50_ms, p50_ms, p50_ms * 2)


def test_the_probe_times_its_writers_and_removes_their_files(tmp_path):
    fig = measure_flushes(64, 2, 25, str(tmp_path))
    assert (fig.writers, fig.payload_bytes, fig.flushes) == (2, 64, 25)
    assert fig.samples == 50  # every round of both writers is counted
    assert 0 < fig.p50_ms <= fig.p99_ms
    assert os.listdir(tmp_path) == []  # the probe's files are removed


def test_bad_probe_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="bad flush probe"):
        measure_flushes(64, 0, 10, str(tmp_path))
    with pytest.raises(ValueError, match="bad flush probe"):
        measure_flushes(64, 1, 0, str(tmp_path))


def test_the_sync_floor_adds_the_two_writer_flush_to_the_async_round_trip():
    figs = [_one("pysyncobj 0.3.17", "memory", 128, 0.100), _one("dledger", "async", 128, 0.120),
            _one("dledger", "sync", 128, 0.400)]
    disk = [FlushFigure(1, 128, 10, 0.050, 0.1, 10), FlushFigure(2, 128, 10, 0.110, 0.2, 20)]
    assert sync_estimate_ms(0.120, disk[1]) == pytest.approx(0.230)
    (line,) = sync_estimates(figs, disk)
    assert "0.110 ms is 1.10x pysyncobj's p50, leaving 0.90x" in line
    assert "(async p50 1.20x): estimated best about 2.30x" in line
    assert sync_estimates(figs, disk[:1]) == []  # no two-writer figure: nothing estimated
    assert [ok for _, ok in targets(figs)] == [False, False]  # 1.20x > 1x, 4.00x > 2x


def test_the_markdown_report_carries_the_disk_table_and_sync_estimates(tmp_path):
    figs = [_one("pysyncobj 0.3.17", "memory", 1024, 0.200), _one("dledger", "async", 1024, 0.150),
            _one("dledger", "sync", 1024, 0.390)]
    disk = [FlushFigure(w, 1024, 10, 0.1 * w, 0.3 * w, 10 * w) for w in (1, 2, 3)]
    path = tmp_path / "bench.md"
    shipped = [_one("pysyncobj 0.3.17", "memory", 1024, 0.600)]
    write_markdown(str(path), figs, "python -m bench.log", disk, shipped)
    text = path.read_text()
    assert render_disk(disk) in text
    assert ("pysyncobj with glibc's default malloc, one proposer: p50 0.600 ms (kept memory: "
            "0.200 ms); dledger's one-proposer p50 against it: async 0.25x, sync 0.65x") in text
    assert "- met: 1024 B: one proposer, sync: p50 1.95x" in text
    assert "fdatasync p50 0.200 ms is 1.00x" in text and "estimated best about 1.75x" in text


def test_a_writer_that_dies_is_reported_by_name_not_waited_for():
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    dead = ctx.Process(target=sys.exit, args=(3,))
    dead.start()
    dead.join(30)
    with pytest.raises(FlushProbeError, match="exited with code 3"):
        _next_result(out, [dead])


def _first_writer_dies(path: str, entry_bytes: int, count: int, start, out) -> None:
    if path.endswith("w0"):
        sys.exit(3)  # before the barrier: the other writer is left waiting there
    flush_loop(path, entry_bytes, count, start, out)


def test_a_writer_that_dies_before_the_start_stops_the_probe_and_leaves_nothing(tmp_path):
    with pytest.raises(FlushProbeError, match="exited with code 3"):
        measure_flushes(64, 2, 10, str(tmp_path), writer=_first_writer_dies)
    assert multiprocessing.active_children() == []
    assert os.listdir(tmp_path) == []
