"""``python -m namesrv`` as a real process: the ready line with the real port, /livez, a clean
exit 0 on SIGTERM and SIGINT, and named errors (no traceback) for a bad option or a busy port."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 10.0
EXIT_TIMEOUT_S = 10.0
HTTP_TIMEOUT_S = 5.0


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "namesrv", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def ready_line(proc: subprocess.Popen[str]) -> dict[str, object]:
    """The first stdout line; readline returns at EOF too, so a crash cannot hang this, and the
    test's own timeout bounds a process that neither prints nor exits."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.communicate(timeout=EXIT_TIMEOUT_S)
    return json.loads(line)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_command_prints_ready_serves_and_stops_cleanly(signum: int) -> None:
    proc = start("--listen", "127.0.0.1:0", "--lease-s", "30", "--scan-interval-s", "1")
    try:
        ready = ready_line(proc)
        assert ready["event"] == "ready"
        host, port = ready["listen"]  # type: ignore[misc]
        assert host == "127.0.0.1" and isinstance(port, int) and port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez",
                                    timeout=HTTP_TIMEOUT_S) as resp:
            assert resp.status == 200 and json.loads(resp.read()) == {"ok": True}
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=EXIT_TIMEOUT_S)
    assert proc.returncode == 0
    assert out == "" and "Traceback" not in err


@pytest.mark.timeout(30)
def test_a_busy_port_and_a_bad_listen_option_are_named_errors_without_a_traceback() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        proc = start("--listen", f"127.0.0.1:{busy.getsockname()[1]}")
        out, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
    assert proc.returncode == 1 and out == ""
    assert "cannot listen on 127.0.0.1" in err and "Traceback" not in err
    proc = start("--listen", "nohost")
    out, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
    assert proc.returncode == 2 and "--listen 'nohost' is not \"host:port\"" in err
