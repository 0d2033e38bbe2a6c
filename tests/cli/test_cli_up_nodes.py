"""``dledger up`` and ``dledger node stop|kill|restart`` with real processes: up prints its nodes'
PIDs and admin URLs and keeps them in DATA_DIR/up.json; ``node kill`` of the leader leaves the
group serving (status: degraded, exit 3), ``node restart`` brings the node back (status: ok);
up reports a requested stop plainly and a crash with how it ended; stopping up by its PID removes
the control file and every node. The control file's refusals (missing, stale, unknown node)
need no cluster: they are checked against processes of the test's own making."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import cli
from cli import control
from tests.cli.up_process import UpProcess


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_up_prints_pids_and_node_kill_and_restart_act_on_this_cluster_only(tmp_path: Path) -> None:
    up = UpProcess(tmp_path / "d").ready()
    try:
        printed = dict(re.findall(r"group a (n\d): pid (\d+) ", up.output()))
        admins = dict(re.findall(r"group a (n\d): .* admin (http://\S+/status)", up.output()))
        assert sorted(printed) == ["n0", "n1", "n2"] and sorted(admins) == sorted(printed)
        for nid, pid in printed.items():
            rec = up.node("a", nid)
            assert rec["pid"] == int(pid) and control.is_process(int(pid), rec["argv"])
            with urllib.request.urlopen(admins[nid], timeout=10) as resp:
                assert json.loads(resp.read())["raft"]["node_id"] == nid

        leader = up.wait_health("ok")["leader"]
        old_pid = up.node("a", leader)["pid"]
        res = up.node_cmd("kill", "a", leader)
        assert res.exit_code == 0 and f"killed a-{leader} (pid {old_pid})" in res.output, res.output
        assert control.process_argv(old_pid) is None  # gone (or an unreaped zombie of up's)
        res = CliRunner().invoke(cli.main, ["send", "--namesrv", up.namesrv, "orders", "after"])
        assert res.exit_code == 0 and "SEND_OK" in res.output, res.output  # the group carries on
        code, group = up.status()
        assert (code, group["health"]) == (3, "degraded"), group
        assert group["leader"] != leader
        up.wait_for(rf"broker a-{leader} was killed by SIGKILL on `dledger node kill`")
        assert f"a-{leader}" not in up.output("err")  # not reported as a crash
        res = up.node_cmd("kill", "a", leader)
        assert res.exit_code == 1 and "is not running: it was killed by SIGKILL" in res.output
        listed = up.node_cmd("list").output
        assert f"a {leader}: not running: it was killed by SIGKILL on `dledger node kill`" in listed
        assert all(f"a {n}: pid {printed[n]} " in listed for n in printed if n != leader), listed

        res = up.node_cmd("restart", "a", leader)
        assert res.exit_code == 0 and f"started a-{leader}: pid" in res.output, res.output
        rec = up.node("a", leader)
        assert rec["pid"] != old_pid and control.is_process(rec["pid"], rec["argv"])
        up.wait_health("ok")

        follower = next(n for n in ("n0", "n1", "n2") if n != leader)
        crashed = up.node("a", follower)["pid"]
        os.kill(crashed, signal.SIGKILL)  # a crash up was not told about
        said = up.wait_for(rf"broker a-{follower} was killed by SIGKILL; its group carries on "
                           rf"without it \((.*)\)", name="err").group(1)
        assert said.startswith("it wrote nothing to ") or said.startswith("last line of "), said

        second = subprocess.run([sys.executable, "-c", "import cli; cli.main()", "up",
                                 "--data-dir", str(up.data_dir), "--namesrv-port", "0"],
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 1 and f"in use by dledger up (pid {up.proc.pid})" in second.stderr

        pids = [n["pid"] for n in up.control()["nodes"] if n["pid"]]
        assert up.stop(signal.SIGTERM) == 0, up.output("err")
        assert not os.path.exists(control.control_path(str(up.data_dir)))
        assert all(control.process_argv(p) is None for p in pids)
    finally:
        up.cleanup()


# -- the control file's refusals, without a cluster ------------------------------------------------


def _write_control(data_dir: Path, up_pid: int, up_argv: list[str], node_pid: int | None,
                   node_argv: list[str]) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / control.REQUESTS_NAME).mkdir(exist_ok=True)
    control.write_json_atomic(control.control_path(str(data_dir)), {
        "version": control.VERSION, "up_pid": up_pid, "up_argv": up_argv, "namesrv": "x:1",
        "namesrv_pid": None, "nodes": [{
            "group": "a", "node": "n0", "pid": node_pid, "argv": node_argv, "client": "x:2",
            "peer": "x:3", "admin": "x:4", "log": "a-n0.log", "data_dir": "a-n0",
            "state": "running", "ended": None}]})


SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def _sleeper() -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(SLEEPER)
    _until(lambda: control.process_argv(proc.pid) == SLEEPER, "the sleeper's exec")
    return proc


def _until(cond: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.02)  # polling a condition of another process


def test_node_commands_refuse_a_missing_control_file(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli.main, ["node", "kill", "a", "n0", "--data-dir", str(tmp_path)])
    assert res.exit_code == 1 and "no cluster started by dledger up" in res.output


def test_node_commands_refuse_a_stale_control_file_and_signal_nothing(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    other = _sleeper()  # alive, but not the node the file names
    try:
        _write_control(tmp_path, gone.pid, ["python", "up"], other.pid, ["python", "-m", "broker"])
        res = CliRunner().invoke(cli.main, ["node", "kill", "a", "n0", "--data-dir", str(tmp_path)])
        assert res.exit_code == 1 and f"is stale: dledger up (pid {gone.pid}) is not running" \
            in res.output, res.output
        me = control.process_argv(os.getpid())
        assert me  # this process stands in for a live up
        _write_control(tmp_path, os.getpid(), me, other.pid, ["python", "-m", "broker"])
        res = CliRunner().invoke(cli.main, ["node", "kill", "a", "n0", "--data-dir", str(tmp_path)])
        assert res.exit_code == 1 and f"pid {other.pid} is no longer a-n0" in res.output, res.output
        res = CliRunner().invoke(cli.main, ["node", "stop", "a", "n9", "--data-dir", str(tmp_path)])
        assert res.exit_code == 1 and "group a has no node 'n9' (nodes: n0)" in res.output
        res = CliRunner().invoke(cli.main, ["node", "restart", "b", "n0", "--data-dir", str(tmp_path)])
        assert res.exit_code == 1 and "no group 'b'" in res.output
        assert other.poll() is None  # never signalled
    finally:
        other.kill()
        other.wait(timeout=30)


def test_up_names_the_bind_error_of_a_busy_namesrv_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        res = subprocess.run([sys.executable, "-c", "import cli; cli.main()", "up",
                              "--data-dir", str(tmp_path), "--namesrv-port",
                              str(busy.getsockname()[1])],
                             capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert "the NameServer did not start: cannot listen on 127.0.0.1:" in res.stderr, res.stderr
    assert "address already in use" in res.stderr
    assert not os.path.exists(control.control_path(str(tmp_path)))


def test_restart_gives_up_at_once_when_up_exits_before_answering(tmp_path: Path) -> None:
    fake_up = _sleeper()  # stands in for an up that dies while a restart waits for it
    try:
        _write_control(tmp_path, fake_up.pid, SLEEPER, None, ["python", "-m", "broker"])
        restart = subprocess.Popen([sys.executable, "-c", "import cli; cli.main()", "node",
                                    "restart", "a", "n0", "--data-dir", str(tmp_path)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _until(lambda: any(tmp_path.joinpath(control.REQUESTS_NAME).iterdir()), "request file")
        fake_up.kill()
        fake_up.wait(timeout=30)
        _, err = restart.communicate(timeout=30)  # not the 60 s of an unanswered request
        assert restart.returncode == 1, err
        assert f"dledger up (pid {fake_up.pid}) exited: a-n0 was not started" in err
        assert not any(tmp_path.joinpath(control.REQUESTS_NAME).iterdir())  # withdrawn
    finally:
        fake_up.kill()
        fake_up.wait(timeout=30)
