"""The topic, message and admin commands against one real ``dledger up`` cluster (shared by the
module; each test uses its own topics): ``consume`` reads past one pull's 4 MiB, ``--max`` is a
total, lines carry keys, properties and ids, ``--follow`` prints new messages until Ctrl-C;
``topic update --queues`` keeps what it is not told to change; errors read as sentences."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO, Any

import pytest
from click.testing import CliRunner, Result

import cli
from client import ConsumeStatus, PushConsumer
from tests.cli.up_process import UpProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
LINE_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def ns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    up = UpProcess(tmp_path_factory.mktemp("up") / "d").ready()
    try:
        yield up.namesrv
    finally:
        up.cleanup()


def _cli(*args: str) -> Result:
    return CliRunner().invoke(cli.main, list(args))


def _ok(*args: str) -> str:
    res = _cli(*args)
    assert res.exit_code == 0, res.output
    return res.output


def test_consume_reads_a_queue_past_one_pulls_4_mib(ns: str) -> None:
    _ok("topic", "create", "--namesrv", ns, "--queues", "1", "big")
    body = "x" * (1 << 20)  # five 1 MiB messages in one queue: a pull stops at 4 MiB
    _ok("send", "--namesrv", ns, "big", *[f"{i}{body}" for i in range(5)])
    assert _ok("consume", "--namesrv", ns, "--count", "big").strip() == "5"
    offsets = re.findall(r"^a/0@(\d+) ", _ok("consume", "--namesrv", ns, "big"), re.M)
    assert offsets == ["0", "1", "2", "3", "4"]


def test_max_counts_messages_over_every_queue(ns: str) -> None:
    _ok("topic", "create", "--namesrv", ns, "--queues", "4", "many")
    _ok("send", "--namesrv", ns, "many", *[f"m{i}" for i in range(12)])
    assert _ok("consume", "--namesrv", ns, "--count", "many").strip() == "12"
    assert len(_ok("consume", "--namesrv", ns, "--max", "5", "many").splitlines()) == 5
    assert _ok("consume", "--namesrv", ns, "--group", "g5", "--max", "5", "--count",
               "many").strip() == "5"
    # the group committed exactly what it read: the rest is 7
    assert _ok("consume", "--namesrv", ns, "--group", "g5", "--count", "many").strip() == "7"


def test_a_line_shows_tags_keys_properties_and_both_ids(ns: str) -> None:
    out = _ok("send", "--namesrv", ns, "--tags", "T", "--key", "k1", "--key", "k2",
              "--prop", "color=red", "props", "hello")
    msg_id, offset_msg_id = re.search(r"msg_id (\S+) offset_msg_id (\S+)", out).groups()
    line = _ok("consume", "--namesrv", ns, "props").strip()
    assert line.endswith("b'hello'") and "tags='T'" in line, line
    assert "keys=['k1', 'k2']" in line and "props={" in line and "'color': 'red'" in line
    assert f"msg_id={msg_id}" in line and f"offset_msg_id={offset_msg_id}" in line


class _Lines:
    """A subprocess's output, read on a thread, waited for with a deadline."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()

    def wait_count(self, n: int, timeout_s: float = LINE_TIMEOUT_S) -> list[str]:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while len(self.lines) < n and time.monotonic() < deadline:
                self.cond.wait(deadline - time.monotonic())
            assert len(self.lines) >= n, self.lines
            return list(self.lines)


def _follow(ns: str, *args: str) -> tuple[subprocess.Popen[str], _Lines]:
    proc = subprocess.Popen([sys.executable, "-c", "import cli; cli.main()", "consume",
                             "--namesrv", ns, "--follow", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, _Lines(proc.stdout)


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """The exit code and standard error of ``proc`` once it ends (killed if it has not within
    the deadline). Its standard output is left to its ``_Lines`` reader: communicate() would
    read it too, and a line it took would never reach the test."""
    assert proc.stderr is not None
    err = _Lines(proc.stderr)  # read as it runs: a full pipe would stall the process
    try:
        proc.wait(timeout=LINE_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # where it hangs: faulthandler's dump on SIGABRT
        proc.send_signal(signal.SIGABRT)
        proc.wait(timeout=LINE_TIMEOUT_S)
        err.thread.join(timeout=LINE_TIMEOUT_S)
        raise AssertionError(f"pid {proc.pid} did not end: {''.join(err.lines)[-6000:]}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=LINE_TIMEOUT_S)
    err.thread.join(timeout=LINE_TIMEOUT_S)
    return proc.returncode, "".join(err.lines)


def test_follow_prints_new_messages_until_ctrl_c(ns: str) -> None:
    _ok("send", "--namesrv", ns, "live", "old1", "old2")
    proc, out = _follow(ns, "live")
    try:
        out.wait_count(2)
        _ok("send", "--namesrv", ns, "live", "new1", "new2", "new3")
        lines = out.wait_count(5)
        assert sorted(ln.split()[-1] for ln in lines) == ["b'new1'", "b'new2'", "b'new3'",
                                                           "b'old1'", "b'old2'"]
        os.kill(proc.pid, signal.SIGINT)
    finally:
        code, err = _finish(proc)
    assert code == 0 and "Traceback" not in err, err


def test_follow_with_max_stops_by_itself(ns: str) -> None:
    _ok("send", "--namesrv", ns, "capped", "a")
    proc, out = _follow(ns, "--max", "3", "capped")
    try:
        out.wait_count(1)
        _ok("send", "--namesrv", ns, "capped", "b", "c", "d")
    finally:
        code, err = _finish(proc)
    assert code == 0 and "Traceback" not in err, err
    assert len(out.wait_count(3)) == 3


def test_topic_update_takes_queues_and_keeps_the_rest(ns: str) -> None:
    _ok("topic", "create", "--namesrv", ns, "--queues", "4", "--perm", "4", "upd")
    out = _ok("topic", "update", "--namesrv", ns, "--queues", "2", "upd")
    assert "group a: updated (read queues 2, write queues 2, perm 4)" in out
    out = _ok("topic", "update", "--namesrv", ns, "--write-queues", "1", "upd")
    assert "group a: updated (read queues 2, write queues 1, perm 4)" in out
    res = _cli("topic", "update", "--namesrv", ns, "upd")
    assert res.exit_code == 2 and "nothing to change" in res.output


def test_topic_update_creates_a_topic_that_does_not_exist(ns: str) -> None:
    # issue 34 item 15: it failed ("group a has no topic"); RocketMQ's updateTopic creates it,
    # with create's defaults for what it is not told
    out = _ok("topic", "update", "--namesrv", ns, "--queues", "2", "made-by-update")
    assert "group a: created (read queues 2, write queues 2, perm 6)" in out, out
    out = _ok("topic", "update", "--namesrv", ns, "--perm", "4", "made-by-update")
    assert "group a: updated (read queues 2, write queues 2, perm 4)" in out, out
    out = _ok("topic", "update", "--namesrv", ns, "--write-queues", "1", "made-by-update-too")
    assert "group a: created (read queues 4, write queues 1, perm 6)" in out, out


def _listed(ns: str, topic: str, *options: str) -> str:
    """``topic list`` once it shows ``topic`` (the leader registers a change at once, but
    asynchronously), with ``options``."""
    deadline = time.monotonic() + LINE_TIMEOUT_S
    while True:
        out = _ok("topic", "list", "--namesrv", ns, *options)
        if topic in out:
            return out
        assert time.monotonic() < deadline, out
        time.sleep(0.1)  # polling the NameServer until the registration arrives


def test_topic_list_shows_queues_perm_and_consumer_groups_and_hides_system_topics(
        ns: str) -> None:
    # issue 34 item 16: names only, system topics among them
    _ok("topic", "create", "--namesrv", ns, "--queues", "2", "--perm", "6", "shown")
    _ok("send", "--namesrv", ns, "shown", "one")
    _ok("consume", "--namesrv", ns, "--group", "lister", "shown")  # commits an offset

    async def with_a_live_member() -> list[dict[str, Any]]:
        """The JSON list once it names both groups of "shown": the one that committed, and
        the one a live member subscribes with (which sends the message back: a system topic,
        %RETRY%live-reader)."""
        consumer = PushConsumer(ns, "live-reader", lambda batch: ConsumeStatus.LATER,
                                heartbeat_s=0.3, start_from="first")
        consumer.subscribe("shown")
        async with consumer:
            deadline = time.monotonic() + LINE_TIMEOUT_S
            while True:
                rows = json.loads(await asyncio.to_thread(
                    _listed, ns, "%RETRY%live-reader", "--all", "--json"))
                found = {r["topic"]: r for r in rows}
                if found["shown"]["consumer_groups"] == ["lister", "live-reader"]:
                    return rows
                assert time.monotonic() < deadline, rows
                await asyncio.sleep(0.1)  # (a commit or heartbeat is applied a moment later)
    by_name = {r["topic"]: r for r in asyncio.run(with_a_live_member())}
    assert by_name["shown"]["groups"] == {"a": {"read_queues": 2, "write_queues": 2, "perm": 6}}
    assert by_name["shown"]["system"] is False and by_name["%RETRY%live-reader"]["system"]
    table = _ok("topic", "list", "--namesrv", ns).splitlines()
    assert table[0].split() == ["topic", "broker", "groups", "consumer", "groups"], table
    line = next(ln for ln in table if ln.startswith("shown "))
    assert "a (queues 2/2, perm 6)" in line and line.rstrip().endswith(" lister, live-reader"), line
    assert not any(ln.startswith(("%RETRY%", "%DLQ%", "RMQ_SYS_")) for ln in table), table
    plain = json.loads(_ok("topic", "list", "--namesrv", ns, "--json"))
    assert "shown" in {r["topic"] for r in plain} and not any(r["system"] for r in plain)
    everything = _ok("topic", "list", "--namesrv", ns, "--all").splitlines()
    assert any(ln.startswith("%RETRY%live-reader ") for ln in everything), everything


def test_a_delayed_send_prints_when_it_is_due(ns: str) -> None:
    # issue 34 item 17: it printed "offset -1"
    due = datetime.datetime.now(datetime.UTC).replace(microsecond=123000) \
        + datetime.timedelta(hours=1)
    out = _ok("send", "--namesrv", ns, "--deliver-at", due.isoformat(), "later", "x")
    assert "offset -1" not in out
    assert f" due {due.isoformat(timespec='milliseconds')} (delay " in out, out
    before_ms = time.time() * 1000
    out = _ok("send", "--namesrv", ns, "--delay-ms", "90000", "later", "y")
    after_ms = time.time() * 1000
    m = re.search(r"^SEND_OK a/\d+ due (\S+) \(delay ([\d.]+) s\) msg_id \S+ offset_msg_id \S+$",
                  out, re.M)
    assert m, out
    due_ms = datetime.datetime.fromisoformat(m.group(1)).timestamp() * 1000
    assert before_ms + 90_000 - 1 <= due_ms <= after_ms + 90_000 + 1  # the broker's clock: this one
    # the delay shown is the due time less the store time, which the group commit takes a few
    # ms after the due time was set (CI printed "delay 89.999 s")
    assert 89 < float(m.group(2)) <= 90, out
    out = _ok("send", "--namesrv", ns, "--delay-level", "2", "later", "z")
    m = re.search(r" due \S+ \(delay ([\d.]+) s\) ", out)
    assert m and 4 < float(m.group(1)) <= 5, out  # level 2: 5 s


def test_errors_read_as_sentences(ns: str) -> None:
    res = _cli("topic", "delete", "--namesrv", ns, "nosuch")
    assert res.exit_code == 1 and "no group has a topic 'nosuch'" in res.output, res.output
    assert "TOPIC_NOT_FOUND: TOPIC_NOT_FOUND" not in res.output
    res = _cli("leader", "transfer", "--namesrv", ns, "a", "n9")
    assert res.exit_code == 1 and "group a has no registered node 'n9'" in res.output, res.output
    assert "ValueError" not in res.output
    res = _cli("topic", "route", "--namesrv", ns, "nosuch")
    assert res.exit_code == 1 and "no group serves topic 'nosuch'" in res.output


def test_status_and_topic_list_fall_over_to_the_next_namesrv(ns: str) -> None:
    dead = "127.0.0.1:1"
    for sep in (",", ";"):
        res = _cli("status", "--namesrv", f"{dead}{sep}{ns}")
        assert res.exit_code == 0 and "health: ok" in res.output, res.output
    _ok("send", "--namesrv", ns, "listed", "x")
    deadline = time.monotonic() + LINE_TIMEOUT_S  # the leader registers a new topic at once,
    while "listed" not in _ok("topic", "list", "--namesrv", ns).split():  # but asynchronously
        assert time.monotonic() < deadline
        time.sleep(0.1)  # polling the NameServer until the registration arrives
    assert "listed" in _ok("topic", "list", "--namesrv", f"{dead};{ns}").split()


def test_watch_repeats_until_interrupted_and_exits_with_the_health(ns: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import cli; cli.main()", "status",
                             "--namesrv", ns, "--watch", "0.5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert proc.stdout is not None
    out = _Lines(proc.stdout)
    try:
        deadline = time.monotonic() + LINE_TIMEOUT_S
        while sum("health: ok" in ln for ln in out.wait_count(1)) < 2:
            assert time.monotonic() < deadline, out.lines
            out.wait_count(len(out.lines) + 1)
        os.kill(proc.pid, signal.SIGINT)
    finally:
        code, err = _finish(proc)
    assert code == 0 and "Traceback" not in err and "Aborted" not in err, err


@pytest.mark.parametrize("period", ["0", "-1"])
def test_watch_refuses_a_period_that_would_spin_or_fail(ns: str, period: str) -> None:
    try:
        res = subprocess.run([sys.executable, "-c", "import cli; cli.main()", "status",
                              "--namesrv", ns, "--watch", period],
                             capture_output=True, text=True, timeout=LINE_TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        raise AssertionError(f"--watch {period} kept running") from err
    assert res.returncode == 2 and "Invalid value for '--watch'" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
