"""Smoke tests of the pysyncobj benchmark peer (figures are printed by the benchmark, not asserted)."""

import glob
import os

import pytest

pytest.importorskip("pysyncobj")

from bench.pysyncobj_peer import SYSTEM, PeerBenchError, run_pysyncobj


def _peer_children() -> list[int]:
    """pids of this process's children that are pysyncobj benchmark members."""
    pids = []
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        try:
            with open(path) as f:
                pids.extend(int(p) for p in f.read().split())
        except OSError:
            continue
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"bench.pysyncobj_peer" in cmd:
            found.append(pid)
    return found


def _check(res: dict, workload: str, count: int, payload: int) -> None:
    assert res["system"] == SYSTEM
    assert res["workload"] == workload
    assert res["payload_bytes"] == payload
    assert res["failures"] == 0
    assert res["entries"] == count
    assert res["entries_per_s"] > 0
    assert 0 < res["p50_ms"] <= res["p99_ms"]
    # every member applied the warm-up and the measured entries
    assert set(res["applied"].values()) == {res["warmup"] + count}


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_one_at_a_time_smoke():
    res = run_pysyncobj("one", payload_bytes=128, count=200, timeout_s=25)
    _check(res, "one", 200, 128)
    assert res["inflight"] == 1
    assert not _peer_children()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_inflight_smoke():
    res = run_pysyncobj("inflight", payload_bytes=128, count=2000, inflight=100, timeout_s=25)
    _check(res, "inflight", 2000, 128)
    assert res["inflight"] == 100
    assert not _peer_children()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_deadline_raises_and_kills_members():
    # Far too short for start-up plus an election: must raise, not hang, and leave no process.
    with pytest.raises(PeerBenchError):
        run_pysyncobj("one", payload_bytes=128, count=10, timeout_s=0.2)
    assert not _peer_children()


def test_rejects_bad_arguments():
    with pytest.raises(ValueError):
        run_pysyncobj("nope", payload_bytes=128, count=10)
    with pytest.raises(ValueError):
        run_pysyncobj("one", payload_bytes=128, count=0)
