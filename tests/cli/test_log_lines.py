"""What the servers log at INFO and how loudly (issue 34, item 1): the rate-limited summaries
(``protocol.log_summary``: at most one line per period however many events, with the counts),
client connection errors through a real listener, slow fsyncs from a node's flusher, a node's
election lines from the role and term the shell observes (quiet in steady state and during
failed pre-votes), membership and retention lines, and start lines that never show a secret."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import protocol.framed
from dledger import logfmt
from dledger.node.config import NodeConfig
from dledger.node.oplog import NodeEventLog
from dledger.node.runtime import Node
from dledger.raft.types import Membership, Role
from dledger.storage.flush import StoreFlusher
from dledger.storage.memstore import MemoryLogStore
from protocol.framed import ConnectionLimits, FramedProtocol
from protocol.log_summary import EventSummary

LINE_TIMEOUT_S = 10.0


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG):
        yield caplog


def _messages(caplog: pytest.LogCaptureFixture, logger: str,
              level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno >= level]


# -- the rate-limited summary --------------------------------------------------------------------

def test_a_flood_of_events_gives_one_line_at_once_and_one_per_period_with_the_counts(
        lines: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    summary = EventSummary(logging.getLogger("t.flood"), "client connection errors",
                           period_s=10.0, clock=clock)
    summary.note("bad frame", "10.0.0.1", "frame of 99 bytes exceeds 10")
    first = _messages(lines, "t.flood")
    assert len(first) == 1 and first[0].startswith("client connection errors: 1 (bad frame 1) "
                                                   "from 1 source; last: 10.0.0.1: frame of 99")
    assert "at most one such line per 10 s" in first[0]
    for k in range(999):  # within the period: counted, not written
        clock.now_s += 0.005
        summary.note("bad frame" if k % 3 else "ConnectionResetError", f"10.0.0.{k % 7}", k)
    assert len(_messages(lines, "t.flood")) == 1
    clock.now_s = 110.0  # the period is over: the next event writes what was counted
    summary.note("refused", "10.0.0.9", "too many connections")
    out = _messages(lines, "t.flood")
    assert len(out) == 2 and summary.lines == 2 and summary.events == 1001
    assert out[1].startswith("client connection errors: 1000 in the last 10 s (bad frame 666, "
                             "ConnectionResetError 333, refused 1) from 8 sources; "
                             "last: 10.0.0.9: too many connections"), out[1]
    summary.flush()  # nothing counted since: nothing written
    assert summary.lines == 2


def test_what_comes_after_the_first_line_is_written_by_a_timer_when_the_period_ends(
        lines: pytest.LogCaptureFixture) -> None:
    async def main() -> EventSummary:
        summary = EventSummary(logging.getLogger("t.timer"), "slow things", period_s=0.2)
        for _ in range(5):
            summary.note("slow", value=0.1)
        deadline = time.monotonic() + LINE_TIMEOUT_S
        while summary.lines < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # polling for the timer's line, with a deadline
        return summary
    asyncio.run(main())
    out = _messages(lines, "t.timer")
    assert len(out) == 2 and out[1].startswith("slow things: 4 "), out


def test_bad_clients_of_a_real_listener_are_summed_up_not_logged_per_connection(
        lines: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    summary = EventSummary(logging.getLogger("protocol.connections"), "client connection errors",
                           period_s=1.0)
    monkeypatch.setattr(protocol.framed, "CLIENT_CONNECTION_ERRORS", summary)
    admitted, refused = 30, 10

    class Server(FramedProtocol):
        def payload_received(self, payload: bytes) -> None:
            return None

    async def until(cond: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + LINE_TIMEOUT_S
        while not cond():
            assert time.monotonic() < deadline, f"no {what} within {LINE_TIMEOUT_S} s"
            await asyncio.sleep(0.02)  # polling the server's side, with a deadline

    async def main() -> None:
        limits = ConnectionLimits(connections_max=admitted)
        server = await asyncio.get_running_loop().create_server(
            lambda: Server(max_frame_bytes=64, limits=limits), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        writers = []
        try:
            for _ in range(admitted):
                writers.append((await asyncio.open_connection("127.0.0.1", port))[1])
            await until(lambda: len(limits.open) == admitted, "admitted connections")
            for _ in range(refused):  # over the listener's limit: OVERLOADED and closed
                writers.append((await asyncio.open_connection("127.0.0.1", port))[1])
            for w in writers[:admitted]:  # a frame far over the limit: the stream is refused
                w.write((1 << 20).to_bytes(4, "big") + b"x" * 8)
            await until(lambda: summary.events == admitted + refused, "errors counted")
            await until(lambda: summary.pending == 0, "summary line at the period's end")
        finally:
            for w in writers:
                w.close()
            server.close()
            await server.wait_closed()
    asyncio.run(main())
    out = _messages(lines, "protocol.connections", logging.WARNING)
    assert 2 <= len(out) <= 3, out  # the first at once, the rest at most once a second
    assert sum(int(line.split(": ", 2)[1].split()[0]) for line in out) == admitted + refused
    text = "\n".join(out)
    assert "bad frame" in text and "refused" in text and "from 1 source" in out[-1], out


# -- slow fsyncs --------------------------------------------------------------------------------

def test_slow_fsyncs_over_the_bar_are_logged_rate_limited_with_the_slowest(
        lines: pytest.LogCaptureFixture) -> None:
    events = NodeEventLog("n0", slow_fsync_s=0.5)
    events.fsync_done(0.2)
    assert _messages(lines, "dledger.storage", logging.WARNING) == []
    events.fsync_done(0.7)
    for seconds in (1.2, 0.6, 2.5, 0.9):
        events.fsync_done(seconds)
    events.slow_fsyncs.flush()  # (the period's end, without waiting for it)
    out = _messages(lines, "dledger.storage", logging.WARNING)
    assert out[0].startswith("slow fsyncs (over 500 ms): 1 (fsync 1); slowest 700 ms"), out
    assert len(out) == 2 and out[1].startswith("slow fsyncs (over 500 ms): 4 ") \
        and "slowest 2500 ms" in out[1], out


def test_a_nodes_flusher_reports_its_fsyncs_to_the_nodes_slow_fsync_log(
        lines: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    node = Node(NodeConfig(group="g", node_id="n0", peers={"n0": ("127.0.0.1", 0)},
                           data_dir=str(tmp_path), slow_fsync_s=0.0))  # (every fsync is slow)
    StoreFlusher(MemoryLogStore(), lambda: None, node.stats).sync_inline(spin=False)
    out = _messages(lines, "dledger.storage", logging.WARNING)
    assert len(out) == 1 and out[0].startswith("slow fsyncs (over 0 ms): 1 (fsync 1)"), out


# -- elections, membership, retention -------------------------------------------------------------

def test_elections_and_leader_changes_are_logged_with_their_terms_and_nothing_in_steady_state(
        lines: pytest.LogCaptureFixture) -> None:
    events = NodeEventLog("n1")
    events.observe(Role.FOLLOWER, 4, None, "n0")
    events.observe(Role.FOLLOWER, 4, "n0", "n0")
    for _ in range(1000):  # heartbeats and appends: the same role, term, leader and vote
        events.observe(Role.FOLLOWER, 4, "n0", "n0")
    for _ in range(5):  # failed pre-votes while partitioned, back to following n0
        events.observe(Role.PRE_CANDIDATE, 4, None, "n0")
        events.observe(Role.FOLLOWER, 4, "n0", "n0")
    events.observe(Role.CANDIDATE, 5, None, "n1")
    events.observe(Role.LEADER, 5, "n1", "n1")
    events.observe(Role.FOLLOWER, 6, None, "n2")  # n2 asked for votes at term 6
    events.observe(Role.FOLLOWER, 6, "n2", "n2")
    events.observe(Role.FOLLOWER, 9, "n0", None)  # a restart's catch-up: term 9's leader
    assert _messages(lines, "dledger.node") == [
        "at term 4 as follower, voted for n0",
        "leader is n0, elected at term 4; this node is a follower",
        "election at term 5: this node stands for leader (term was 4, leader n0)",
        "leader is n1: this node won the election at term 5",
        "election at term 6: voted for n2 (term was 5, leader n1)",
        "leader is n2, elected at term 6; this node is a follower",
        "leader is n0, elected at term 9; this node is a follower",
    ]


def test_membership_changes_and_retention_deletions_are_logged_once_each(
        lines: pytest.LogCaptureFixture) -> None:
    events = NodeEventLog("n0")
    events.observe_membership(Membership(("n0", "n1", "n2")), 0, False)
    events.observe_membership(Membership(("n0", "n1", "n2")), 0, False)  # (the same, rebuilt)
    events.observe_membership(Membership(("n0", "n1", "n2"), ("n3",)), 42, True)
    events.retained(1, 1)
    events.retained(1, 1001)
    assert _messages(lines, "dledger.node") == [
        "membership: voters n0, n1, n2 (log index 0)",
        "membership changed: voters n0, n1, n2; learners n3 (log index 42, not committed yet)",
        "retention deleted log entries 1..1000 (1000 entries); the log starts at 1001",
    ]


# -- start lines -----------------------------------------------------------------------------------

def test_the_start_line_names_version_and_options_and_never_a_secret(
        lines: pytest.LogCaptureFixture) -> None:
    logfmt.log_start("dledger-broker", {
        "group": "a", "peers": "n0=127.0.0.1:1", "cluster_key_file": "/k/cluster.key",
        "tls_key": "/k/node.key", "acl_admin_keys": ("root",), "secret_key": "s3cr3t-value",
        "client_password": "hunter2", "access_token": "tok-123", "cluster_key": "c0ffee",
        "advertise": None})
    [line] = _messages(lines, "dledger.process")
    assert line.startswith(f"dledger-broker {logfmt.program_version()} starting (pid ")
    assert "group=a" in line and "cluster_key_file=/k/cluster.key" in line
    assert "tls_key=/k/node.key" in line and "acl_admin_keys=root" in line
    assert "secret_key=<redacted>" in line and "client_password=<redacted>" in line
    for secret in ("s3cr3t-value", "hunter2", "tok-123", "c0ffee"):
        assert secret not in line
    assert "advertise" not in line  # (no value: not shown)
