"""``python -m bench.hops``: the steps of a lone send from stamps (``bench.hops.timeline``, on
made-up stamps), and the tool run for real on a small group, following its sends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.hops.timeline import (
    CLIENT,
    ROUND_STEPS,
    STEPS,
    Stamp,
    Timeline,
    median_rounds,
    median_steps,
)

ROOT = Path(__file__).resolve().parents[2]
REQUEST = "8401186e"  # [1, 110, ...]: a client request (a kind of 24 or more)
REPLY = "84011850"
APPEND = "89010301"  # [1, 3, ...]: Raft's append
ANSWER = "89010401"  # [1, 4, ...]: its answer
HEARTBEAT = "87010501"


def _path(sync: bool) -> list[Stamp]:
    """One send's stamps, 10 ns apart, the steps numbered by their end; node b leads, c
    answers first, a later; noise around (a heartbeat, the leader's own sync)."""
    s = [Stamp(10, CLIENT, "out", REQUEST), Stamp(20, "b", "in", REQUEST),
         Stamp(25, "b", "out", HEARTBEAT), Stamp(27, "c", "in", HEARTBEAT),
         Stamp(30, "b", "out", APPEND), Stamp(35, "b", "sync0", ""), Stamp(40, "c", "in", APPEND),
         Stamp(45, "a", "in", APPEND)]
    if sync:
        s += [Stamp(50, "c", "sync0", ""), Stamp(60, "c", "sync1", "")]
    s += [Stamp(62, "b", "sync1", ""), Stamp(70, "c", "out", ANSWER), Stamp(80, "b", "in", ANSWER),
          Stamp(85, "a", "out", ANSWER), Stamp(90, "b", "out", REPLY), Stamp(100, CLIENT, "in", REPLY)]
    return s


def test_a_sync_send_is_followed_through_the_follower_that_answers_first() -> None:
    steps = Timeline(_path(sync=True)).send(5, 105)
    assert steps == [5, 10, 10, 10, 10, 10, 10, 10, 10, 10, 5]
    assert len(steps) == len(STEPS)


def test_an_async_send_has_no_sync_step() -> None:
    assert Timeline(_path(sync=False)).send(5, 105) == [5, 10, 10, 10, 0, 0, 30, 10, 10, 10, 5]


def test_a_send_whose_path_is_not_all_there_is_not_followed() -> None:
    stamps = [s for s in _path(sync=True) if not (s.process == "b" and s.head == REPLY)]
    assert Timeline(stamps).send(5, 105) is None
    assert Timeline(_path(sync=True)).send(5, 95) is None  # (the reply came after it returned)
    assert median_steps(Timeline(stamps), [(5, 105)]) == ([], 0)
    medians, followed = median_steps(Timeline(_path(sync=True)), [(5, 105)])
    assert followed == 1 and medians[1] == 0.01  # (us)


def test_the_tool_follows_the_sends_of_a_real_group() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.hops", "--sends", "40"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    head, *lines = done.stdout.strip().splitlines()
    followed = int(head.split("; ")[-1].split()[0])
    assert followed >= 30, head  # (a send may go out with a route refresh, or be redirected)
    assert len(lines) == len(STEPS) + 1 and lines[-1].endswith("in all (the sum of the medians)")


def test_rounds_are_followed_from_one_request_to_the_next() -> None:
    """Two requests of a closed loop: the first followed to its reply, then the client's turn
    until the second leaves (the second is not followed: nothing comes after it)."""
    first = _path(sync=True)
    second = [Stamp(s.ns + 200, s.process, s.event, s.head) for s in _path(sync=True)]
    rounds = Timeline(first + second).rounds()
    assert rounds == [[10, 10, 10, 10, 10, 10, 10, 10, 10, 110]]
    medians, followed = median_rounds(Timeline(first + second))
    assert followed == 1 and medians[-1] == 0.11 and len(medians) == len(ROUND_STEPS)


def test_the_tool_follows_the_rounds_of_callers_over_topics() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.hops", "--sends", "1280", "--topics", "64"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    head, *lines = done.stdout.strip().splitlines()
    assert int(head.split("; ")[-1].split()[0]) >= 5, head
    assert len(lines) == len(ROUND_STEPS) + 1


def test_rounds_reads_the_send_counters_of_a_metrics_page() -> None:
    from bench.hops.rounds import counts
    page = "\n".join([
        "# HELP dledger_messages_in_total Messages stored",
        'dledger_messages_in_total{group="g",node="n0",topic="a"} 120.0',
        'dledger_messages_in_total{group="g",node="n0",topic="b"} 8.0',
        'dledger_commit_latency_seconds_count{group="g",node="n0"} 2.0',
        'dledger_commit_latency_seconds_sum{group="g",node="n0"} 0.5',
        'dledger_send_latency_seconds_count{group="g",node="n0"} 3.0',
        'dledger_messages_out_total{group="g",node="n0",topic="a"} 99.0',
    ])
    got = counts(page)
    assert (got.entries, got.requests, got.messages) == (2.0, 3.0, 128.0)


@pytest.mark.slow
def test_rounds_runs_on_a_small_group() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.hops.rounds", "--seconds", "0.5",
                          "--topics", "2", "--callers", "4"], capture_output=True, text=True,
                         timeout=240, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "from 4 callers over 2 topics" in lines[0] and "msg/s" in lines[0], out.stdout
    per_entry = float(lines[1].split(": ")[1].split(" messages an entry")[0])
    assert 1.0 <= per_entry <= 4.0, out.stdout  # (4 callers: at most 4 messages in a round)
    assert "CPU us a message: leader n" in lines[2] and "client" in lines[2], out.stdout
