"""The command line against real processes: `dledger up` in the foreground, then `status`,
`propose`, `read` and `leader transfer` against it, as a user would type them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import cli

pytestmark = pytest.mark.slow


def _start_up(tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import cli; cli.main()", "log", "up", "--data-dir", str(tmp_path / "data"),
         "--peer-port", "0", "--client-port", "0", "--exit-after-s", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"dledger log status --nodes (\S+)", line)
        if m:
            return proc, m.group(1)
    proc.kill()
    raise AssertionError("dledger up did not print a connect line:\n" + "".join(lines))


def test_up_status_propose_read_transfer(tmp_path: Path) -> None:
    proc, nodes = _start_up(tmp_path)
    runner = CliRunner()
    try:
        res = runner.invoke(cli.main, ["log", "propose", "--nodes", nodes, "hello", "world"])
        assert res.exit_code == 0, res.output
        assert res.output.count("committed index") == 2
        res = runner.invoke(cli.main, ["log", "read", "--nodes", nodes, "--max", "10"])
        assert res.exit_code == 0 and "b'hello'" in res.output and "b'world'" in res.output
        res = runner.invoke(cli.main, ["log", "status", "--nodes", nodes, "--json"])
        assert res.exit_code == 0, res.output
        rows = json.loads(res.output)
        leader = next(r["node"] for r in rows if r["role"] == "leader")
        target = next(r["node"] for r in rows if r["role"] != "leader")
        res = runner.invoke(cli.main, ["log", "leader", "transfer", "--nodes", nodes, target])
        assert res.exit_code == 0, res.output
        assert f"from {leader} to {target}" in res.output
        res = runner.invoke(cli.main, ["log", "status", "--nodes", nodes])
        assert res.exit_code == 0 and "leader" in res.output
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "stopping" in out


def test_status_exits_non_zero_when_no_node_answers() -> None:
    res = CliRunner().invoke(cli.main, ["log", "status", "--nodes", "n0=127.0.0.1:1"])
    assert res.exit_code == 2
    assert "unreachable" in res.output


def test_bad_peer_spec_is_a_clear_error() -> None:
    res = CliRunner().invoke(cli.main, ["log", "status", "--nodes", "nonsense"])
    assert res.exit_code != 0
    assert "expected ID=HOST:PORT" in res.output


def test_broker_cluster_up_send_consume_status(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import cli; cli.main()", "up", "--data-dir", str(tmp_path / "d"),
         "--namesrv-port", "0", "--peer-port", "0", "--client-port", "0", "--grpc-port", "0",
         "--remoting-port", "0",
         "--exit-after-s", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    ns = None
    deadline = time.monotonic() + 60
    lines = []
    while time.monotonic() < deadline and ns is None:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"dledger status --namesrv (\S+)", line)
        ns = m.group(1) if m else None
    assert ns, "dledger up did not print a connect line:\n" + "".join(lines)
    runner = CliRunner()
    try:
        res = runner.invoke(cli.main, ["send", "--namesrv", ns, "--tags", "T", "orders", "one", "two"])
        assert res.exit_code == 0 and res.output.count("SEND_OK") == 2, res.output
        res = runner.invoke(cli.main, ["consume", "--namesrv", ns, "--group", "g1", "orders"])
        assert res.exit_code == 0 and "b'one'" in res.output and "b'two'" in res.output, res.output
        res = runner.invoke(cli.main, ["consume", "--namesrv", ns, "--group", "g1", "--count", "orders"])
        assert res.output.strip() == "0"  # the group's offsets were committed by the first read
        res = runner.invoke(cli.main, ["topic", "create", "--namesrv", ns, "--perm", "4", "ro"])
        assert res.exit_code == 0 and "group a: OK" in res.output
        res = runner.invoke(cli.main, ["send", "--namesrv", ns, "ro", "x"])
        assert res.exit_code != 0 and "NoPermissionError" in res.output
        res = runner.invoke(cli.main, ["status", "--namesrv", ns, "--json"])
        assert res.exit_code == 0, res.output
        group = json.loads(res.output)[0]
        assert group["health"] == "ok" and len(group["nodes"]) == 3
        res = runner.invoke(cli.main, ["consumer", "progress", "--namesrv", ns, "g1", "orders"])
        assert res.exit_code == 0 and "committed" in res.output
        res = runner.invoke(cli.main, ["topic", "update", "--namesrv", ns, "--read-queues", "8",
                                       "--write-queues", "8", "orders"])
        assert res.exit_code == 0 and "group a: updated" in res.output
        deadline = time.monotonic() + 10  # the route shows the change once the leader re-registers
        while True:
            res = runner.invoke(cli.main, ["topic", "status", "--namesrv", ns, "orders"])
            if res.output.count("a/") == 8 or time.monotonic() > deadline:
                break
            time.sleep(0.1)  # polling the NameServer until the route changes
        assert res.exit_code == 0 and res.output.count("a/") == 8, res.output
        target = next(n["node"] for n in group["nodes"] if n["role"] != "leader")
        res = runner.invoke(cli.main, ["leader", "transfer", "--namesrv", ns, "a", target])
        assert res.exit_code == 0 and f"to {target}" in res.output, res.output
        res = runner.invoke(cli.main, ["leader", "transfer", "--namesrv", ns, "a", target])
        assert res.exit_code == 0 and f"{target} already leads" in res.output, res.output
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out


def test_the_command_line_loads_without_the_chaos_harness() -> None:
    """`make up` installs without the dev extra: `dledger` must not import the chaos harness
    (toxiproxy-python, requests) until `dledger chaos` is used."""
    code = ("import sys, cli; "
            "assert not [m for m in sys.modules if m.startswith(('chaos.live', 'toxiproxy'))]")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("period", ["0", "-1", "0.1"])
def test_log_status_refuses_a_watch_period_below_half_a_second(period: str) -> None:
    """`dledger log status --watch 0` used to spin and `--watch -1` to end in a traceback."""
    from click.testing import CliRunner

    from dledger.log_cli import main as log_main

    res = CliRunner().invoke(log_main, ["status", "--nodes", "127.0.0.1:1", "--watch", period])
    assert res.exit_code == 2 and "--watch" in res.output and "Traceback" not in res.output, res.output


def test_the_status_table_shows_last_contact_in_milliseconds() -> None:
    from cli.status import status_table

    follower = {"lag": 0, "last_contact_ticks": 2, "last_contact_ms": 200}
    row = {"group": "a", "voters": ["n0", "n1", "n2"], "health": "ok", "nodes": [
        {"node": "n0", "role": "leader", "term": 3, "last_index": 9, "commit_index": 9,
         "applied_index": 9, "followers": {
             "n1": follower, "n2": {"lag": 9, "last_contact_ticks": -1, "last_contact_ms": -1},
             "n3": {"lag": 1, "last_contact_ticks": 4, "last_contact_ms": None}}}]}
    assert "n1: 0 / 200 ms, n2: 9 / never, n3: 1 / 4 ticks" in status_table([row])
