"""``dledger up`` as a real process for the command-line tests: free ports, a tmp data dir, its
stdout and stderr read on threads so that a test waits for a line with a deadline, and stopped
by its PID (then any node it left behind, by the PIDs of its control file, checked first). Also
what the tests ask of its cluster: ``dledger status`` of group a (``status``, ``wait_health``) and
``dledger node ...`` on its data directory (``node_cmd``)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from click.testing import CliRunner, Result

import cli
from cli import control

START_TIMEOUT_S = 90.0  # three brokers and a NameServer on a machine shared with other sessions
STOP_TIMEOUT_S = 30.0
HEALTH_TIMEOUT_S = 60.0


class UpProcess:
    def __init__(self, data_dir: Path, *extra: str) -> None:
        self.data_dir = data_dir
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import cli; cli.main()", "up", "--data-dir", str(data_dir),
             "--namesrv-port", "0", "--peer-port", "0", "--client-port", "0", "--grpc-port", "0",
         "--remoting-port", "0",
             "--exit-after-s", "600", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self._lines: dict[str, list[str]] = {"out": [], "err": []}
        self._changed = threading.Condition()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [threading.Thread(target=self._read, args=(name, stream), daemon=True)
                         for name, stream in (("out", self.proc.stdout), ("err", self.proc.stderr))]
        for t in self._readers:
            t.start()
        self.namesrv = ""

    def _read(self, name: str, stream: IO[str]) -> None:
        for line in stream:
            with self._changed:
                self._lines[name].append(line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def output(self, name: str = "out") -> str:
        with self._changed:
            return "".join(self._lines[name])

    def wait_for(self, pattern: str, name: str = "out",
                 timeout_s: float = START_TIMEOUT_S) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                m = re.search(pattern, "".join(self._lines[name]))
                if m:
                    return m
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not any(
                        t.is_alive() for t in self._readers)):
                    raise AssertionError(f"no {pattern!r} in up's std{name}:\n{self.output('out')}"
                                         f"\n--- stderr:\n{self.output('err')}")
                self._changed.wait(min(left, 1.0))

    def ready(self) -> UpProcess:
        self.namesrv = self.wait_for(r"dledger status --namesrv (\S+)").group(1)
        self.wait_for(r"Ctrl-C stops everything")
        return self

    def status(self) -> tuple[int, dict[str, Any]]:
        """``dledger status --json``: its exit code and group a's row."""
        res = CliRunner().invoke(cli.main, ["status", "--namesrv", self.namesrv, "--json"])
        assert res.exit_code in (0, 2, 3), res.output
        return res.exit_code, json.loads(res.output)[0]

    def wait_health(self, health: str) -> dict[str, Any]:
        """Group a's row once its health is ``health`` (within ``HEALTH_TIMEOUT_S``)."""
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while True:
            _code, group = self.status()
            if group["health"] == health or time.monotonic() > deadline:
                assert group["health"] == health, group
                return group
            time.sleep(0.2)  # polling the cluster's view until it settles

    def node_cmd(self, *args: str) -> Result:
        """``dledger node ARGS --data-dir`` this up's."""
        return CliRunner().invoke(cli.main, ["node", *args, "--data-dir", str(self.data_dir)])

    def control(self) -> dict[str, Any]:
        with open(control.control_path(str(self.data_dir)), encoding="utf-8") as f:
            return json.load(f)

    def node(self, group: str, node: str) -> dict[str, Any]:
        return control.find_node(self.control(), group, node)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Signal up by its PID and wait for it; returns its exit code."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        return self.proc.wait(timeout=STOP_TIMEOUT_S)

    def cleanup(self) -> None:
        """After a test, pass or fail: up stopped, and nothing it started left running."""
        try:
            nodes = self.control()["nodes"]
        except (OSError, ValueError):
            nodes = []
        if self.proc.poll() is None:
            try:
                self.stop()
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_TIMEOUT_S)
        for n in nodes:  # only if up could not stop them: PIDs checked against their argv
            if control.is_process(n["pid"], n["argv"]):
                os.kill(n["pid"], signal.SIGKILL)
        for t in self._readers:
            t.join(timeout=STOP_TIMEOUT_S)
