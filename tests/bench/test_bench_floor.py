"""``python -m bench.floor``: its replica's offsets and framing, how it reads its rows against
NATS's, and the tool run for real on three server processes (without NATS)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import cbor2
import pytest

from bench.floor import FLOOR, FRAME, NATS, OURS, Framed, Replica, ratios
from bench.harness import Row

ROOT = Path(__file__).resolve().parents[2]


def test_each_replica_gives_a_topic_its_next_offsets_in_order(tmp_path: Path) -> None:
    r = Replica(str(tmp_path / "log"), sync=True)
    assert r.apply(cbor2.dumps([["a", b"1"], ["b", b"2"], ["a", b"3"]])) == [0, 0, 1]
    assert r.apply(cbor2.dumps([["a", b"4"]])) == [2]
    r.append(b"entry")
    r.append(b"more")
    assert (tmp_path / "log").read_bytes() == b"entrymore" and r.end_bytes == 9


def test_frames_split_anywhere_arrive_whole_and_an_oversized_one_is_refused() -> None:
    got: list[bytes] = []

    async def feed() -> None:
        f = Framed(lambda _p, body: got.append(body))
        stream = FRAME.pack(3) + b"abc" + FRAME.pack(0) + FRAME.pack(5) + b"hello"
        for i in range(len(stream)):  # one byte at a time
            f.data_received(stream[i:i + 1])
        assert got == [b"abc", b"", b"hello"]
        with pytest.raises(ValueError, match="frame of"):
            f.data_received(FRAME.pack(1 << 30))

    asyncio.run(feed())


def test_the_floor_and_ours_are_read_against_nats_and_ours_against_the_floor() -> None:
    rows = [Row(FLOOR, "sync", "sync", 128, 2000.0, 0.5, 1.0, cpu_s_per_10k=3.0),
            Row(FLOOR, "sync", "batch", 128, 90000.0, cpu_s_per_10k=0.2),
            Row(FLOOR, "sync", "64 topics", 1024, 30000.0, 1.0, 2.0),
            Row(NATS, "-", "sync", 128, 2500.0, 0.4, 0.9, cpu_s_per_10k=6.0),
            Row(NATS, "-", "batch", 128, 30000.0, cpu_s_per_10k=0.1),
            Row(NATS, "-", "64 topics", 128, 10000.0, 1.0, 2.0),
            Row(OURS, "sync", "sync", 128, 1000.0, 1.0, 2.0, cpu_s_per_10k=9.0)]
    assert ratios(rows) == [
        "128 B one producer sync, floor (Python) against NATS JetStream R3: p50 1.25x "
        "(bar <= 1.2x), servers' CPU 0.50x (bar <= 1x)",
        "128 B batch sync, floor (Python) against NATS JetStream R3: msg/s 3.00x (bar >= 3x), "
        "servers' CPU 2.00x",
        "128 B one producer sync, dledger against NATS JetStream R3: p50 2.50x (bar <= 1.2x), "
        "servers' CPU 1.50x (bar <= 1x)",
        "128 B one producer sync, dledger against floor (Python): p50 2.00x, servers' CPU 3.00x",
    ]  # (the 1 KiB row has no NATS row of its payload)


@pytest.mark.slow
def test_the_tool_runs_three_servers_and_stops_them() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.floor", "--no-nats", "--payloads", "64",
                          "--messages", "640"], capture_output=True, text=True, timeout=240,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    rows = [line.split(" | ") for line in out.stdout.splitlines() if line.startswith(f"| {FLOOR}")]
    assert [r[2] for r in rows] == ["sync", "batch", "64 topics"], out.stdout
    assert all(float(r[4].replace(",", "")) > 0 for r in rows), out.stdout
