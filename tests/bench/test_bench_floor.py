"""``python -m bench.floor``: its replica, its leader's commit rule and its framing, how it reads
its rows against NATS's and ours, and the tool run for real on three server processes (without
NATS)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import cbor2
import pytest

from bench.floor import (
    FLOOR,
    FRAME,
    INDEX,
    NATS,
    OURS,
    Framed,
    Leader,
    Replica,
    ratios,
    run_floor,
)
from bench.harness import Row

ROOT = Path(__file__).resolve().parents[2]


class _Link:
    """A stand-in for a ``Framed`` connection: what was sent on it."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.transport = self

    def is_closing(self) -> bool:
        return False

    def send(self, bodies: list[bytes]) -> None:
        self.sent += bodies


def test_each_replica_gives_a_topic_its_next_offsets_in_order(tmp_path: Path) -> None:
    r = Replica(str(tmp_path / "log"), sync=False)
    assert r.apply(cbor2.dumps([["a", b"1"], ["b", b"2"], ["a", b"3"]])) == [0, 0, 1]
    assert r.apply(cbor2.dumps([["a", b"4"]])) == [2]
    r.append([b"entry", b"more"])
    r.append([b"!"])
    assert (tmp_path / "log").read_bytes() == b"entrymore!" and r.end_bytes == 10


@pytest.mark.parametrize("sync", [True, False])
def test_a_replica_fdatasyncs_each_group_commit_once_in_sync_mode_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: bool) -> None:
    synced: list[int] = []
    monkeypatch.setattr(os, "fdatasync", synced.append)
    r = Replica(str(tmp_path / "log"), sync=sync)
    r.append([b"a", b"b", b"c"])
    assert synced == ([r.fd] if sync else [])


def test_the_leader_answers_only_what_a_follower_acknowledged_in_log_order(
        tmp_path: Path) -> None:
    leader = Leader(Replica(str(tmp_path / "log"), sync=False))
    f1, f2, c1, c2 = _Link(), _Link(), _Link(), _Link()
    leader.followers = [f1, f2]  # type: ignore[list-item]
    frames = [cbor2.dumps([["t", b"x"]]), cbor2.dumps([["t", b"y"], ["u", b"z"]])]
    leader.on_requests(c1, frames)  # type: ignore[arg-type]
    leader.on_requests(c2, [cbor2.dumps([["t", b"w"]])])  # type: ignore[arg-type]
    assert f1.sent == f2.sent and [INDEX.unpack(e[:INDEX.size])[0] for e in f1.sent] == [1, 2, 3]
    assert f1.sent[1][INDEX.size:] == frames[1]
    assert c1.sent == c2.sent == []  # written here, but no follower has acknowledged any
    leader.on_acks(f2, [INDEX.pack(1)])  # type: ignore[arg-type]
    assert [cbor2.loads(b) for b in c1.sent] == [[0]] and c2.sent == []
    leader.on_acks(f1, [INDEX.pack(2), INDEX.pack(3)])  # type: ignore[arg-type]
    assert [cbor2.loads(b) for b in c1.sent] == [[0], [1, 0]]  # (each ack covers all before it)
    assert [cbor2.loads(b) for b in c2.sent] == [[2]]
    leader.on_acks(f2, [INDEX.pack(3)])  # type: ignore[arg-type]
    assert len(c1.sent) == 2 and len(c2.sent) == 1  # answered once


def test_frames_split_anywhere_arrive_whole_and_an_oversized_one_is_refused() -> None:
    got: list[list[bytes]] = []

    async def feed() -> None:
        f = Framed(lambda _p, bodies: got.append(bodies))
        stream = FRAME.pack(3) + b"abc" + FRAME.pack(0) + FRAME.pack(5) + b"hello"
        for i in range(len(stream)):  # one byte at a time
            f.data_received(stream[i:i + 1])
        f.data_received(stream)  # at once: the frames of one read come together
        assert got == [[b"abc"], [b""], [b"hello"], [b"abc", b"", b"hello"]]
        with pytest.raises(ValueError, match="frame of"):
            f.data_received(FRAME.pack(1 << 30))

    asyncio.run(feed())


def test_the_floor_and_ours_are_read_against_nats_and_ours_against_the_floor() -> None:
    rows = [Row(FLOOR, "sync", "sync", 128, 2000.0, 0.5, 1.0, cpu_s_per_10k=3.0),
            Row(FLOOR, "sync", "batch", 128, 90000.0, cpu_s_per_10k=0.2),
            Row(FLOOR, "sync", "64 topics", 128, 40000.0, 1.0, 2.0, cpu_s_per_10k=0.1),
            Row(FLOOR, "sync", "64 topics", 1024, 30000.0, 1.0, 2.0),
            Row(NATS, "-", "sync", 128, 2500.0, 0.4, 0.9, cpu_s_per_10k=6.0),
            Row(NATS, "-", "batch", 128, 30000.0, cpu_s_per_10k=0.1),
            Row(NATS, "-", "64 topics", 128, 10000.0, 1.0, 2.0, cpu_s_per_10k=0.4),
            Row(OURS, "sync", "sync", 128, 1000.0, 1.0, 2.0, cpu_s_per_10k=9.0)]
    assert ratios(rows) == [
        "128 B one producer sync, floor (Python) against NATS JetStream R3: p50 1.25x "
        "(bar <= 1.2x), servers' CPU 0.50x (bar <= 1x)",
        "128 B batch sync, floor (Python) against NATS JetStream R3: msg/s 3.00x (bar >= 3x), "
        "servers' CPU 2.00x",
        "128 B 64 topics sync, floor (Python) against NATS JetStream R3: msg/s 4.00x "
        "(bar >= 1.5x), servers' CPU 0.25x (bar <= 1x)",
        "128 B one producer sync, dledger against NATS JetStream R3: p50 2.50x (bar <= 1.2x), "
        "servers' CPU 1.50x (bar <= 1x)",
        "128 B one producer sync, dledger against floor (Python): p50 2.00x, servers' CPU 3.00x",
    ]  # (the 1 KiB row has no NATS row of its payload)


@pytest.mark.slow
def test_the_tool_runs_three_servers_and_stops_them() -> None:
    started: list[subprocess.Popen[str]] = []
    rows = run_floor(64, 640, "sync", started)
    assert [r.workload for r in rows] == ["sync", "batch", "64 topics"]
    assert all(r.system == FLOOR and r.msgs_per_s > 0 for r in rows), rows
    assert rows[0].p50_ms is not None and rows[0].p50_ms > 0
    assert len(started) == 3 and all(p.returncode is not None for p in started)


@pytest.mark.slow
def test_the_command_prints_its_rows() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.floor", "--no-nats", "--payloads", "64",
                          "--messages", "640"], capture_output=True, text=True, timeout=240,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    rows = [line.split(" | ") for line in out.stdout.splitlines() if line.startswith(f"| {FLOOR}")]
    assert [r[2] for r in rows] == ["sync", "batch", "64 topics"], out.stdout
