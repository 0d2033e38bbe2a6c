"""The real RocketMQ clients the tests drive, each in an environment of its own that
``make clients`` makes (``.venv-clients/``; ``make test`` makes it first): the 4.x C++ client's
Python wrapper (``cpp_client.py`` runs in it), ali-ons in JavaScript (``ali_client.js``) and the
official RocketMQ 5 Node.js client (``tests/frontends/rmq5_node_client.js``). Missing, a test
is skipped saying so, or fails under ``CI``, which must have made it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CPP_PYTHON = REPO / ".venv-clients" / "rmq4" / "bin" / "python"
BATCH_PYTHON = REPO / ".venv-clients" / "rmq4-batch" / "bin" / "python"  # rocketmq 0.4.4
CPP_CLIENT = Path(__file__).with_name("cpp_client.py")
ALI_ONS_DIR = REPO / ".venv-clients" / "ali-ons"
ALI_CLIENT = Path(__file__).with_name("ali_client.js")
RMQ5_NODE_DIR = REPO / ".venv-clients" / "rmq5-node"  # npm rocketmq-client-nodejs 1.0.8
RMQ5_NODE_CLIENT = REPO / "tests" / "frontends" / "rmq5_node_client.js"


def cpp_python() -> str:
    """The C++ client's interpreter, or a skip (a failure in CI) saying how to make it."""
    if not CPP_PYTHON.exists():
        _missing(CPP_PYTHON, "run `make clients`")
    return str(CPP_PYTHON)


def _missing(what: Path, how: str) -> None:
    why = f"{what} is missing: {how}"
    if os.environ.get("CI"):
        pytest.fail(why + "; CI must make it (make test does)")
    pytest.skip(why)


def ali(home: Path, *args: str) -> subprocess.Popen[str]:
    """``node ali_client.js ARGS`` started (ali-ons from ``make clients``); stop it by its PID."""
    return _node(ALI_CLIENT, ALI_ONS_DIR, "ali-ons", "ALI_ONS_DIR", home, args)


def rmq5_node(home: Path, *args: str) -> subprocess.Popen[str]:
    """``node rmq5_node_client.js ARGS`` started (the RocketMQ 5 Node.js client from ``make
    clients``); read its JSON lines with ``read_until`` or ``finish``, stop it by its PID."""
    return _node(RMQ5_NODE_CLIENT, RMQ5_NODE_DIR, "rocketmq-client-nodejs", "RMQ5_NODE_DIR",
                 home, args)


def rmq5_node_installed() -> None:
    """A skip (a failure in CI) unless ``make clients`` installed the RocketMQ 5 Node.js client
    (a test calls it before it starts anything)."""
    _npm_installed(RMQ5_NODE_DIR, "rocketmq-client-nodejs")


def _npm_installed(folder: Path, package: str) -> None:
    if not (folder / "node_modules" / package / "package.json").exists():
        _missing(folder, "run `make clients` (npm and Node 20)")


def _node(script: Path, folder: Path, package: str, folder_env: str, home: Path,
          args: tuple[str, ...]) -> subprocess.Popen[str]:
    """``node SCRIPT ARGS`` with npm ``package`` from ``folder`` (named to it in $folder_env)."""
    _npm_installed(folder, package)
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home), folder_env: str(folder)}
    return subprocess.Popen(["node", str(script), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(home))


def cpp(home: Path, *args: str, python: str | None = None,
        stdin: bool = False) -> subprocess.Popen[str]:
    """``cpp_client.py ARGS`` started (its logs under ``home``/logs, as the C++ client keeps
    them under $HOME; ``python``: another wrapper's interpreter, ``batch_python()``); read its
    JSON lines with ``read_until`` or ``finish``, stop it by its PID; ``stdin``: a pipe to it
    (closing it ends a producer's ``--hold-s``)."""
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": ""}
    return subprocess.Popen([python or cpp_python(), str(CPP_CLIENT), *args],
                            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=str(home))


def batch_python() -> str:
    """The older wrapper's interpreter (PyPI rocketmq 0.4.4: batch sends), or a skip (a failure
    in CI)."""
    if not BATCH_PYTHON.exists():
        _missing(BATCH_PYTHON, "run `make clients`")
    return str(BATCH_PYTHON)


def finish(proc: subprocess.Popen[str], timeout_s: float) -> list[dict[str, Any]]:
    """The JSON lines of a client that ends by itself within ``timeout_s`` (killed past it)."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=10)
    if proc.returncode != 0:
        sys.stderr.write(err[-4000:])
    out = _PENDING.pop(proc.pid, b"").decode() + out  # (what read_until had read past)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def read_until(proc: subprocess.Popen[str], done: Any, timeout_s: float) -> list[dict[str, Any]]:
    """The JSON lines a running client prints until ``done(line)`` holds for one (a deadline:
    ``timeout_s``; the lines so far are returned either way). Reads the pipe's bytes itself (a
    buffered ``readline`` would keep lines that came together where ``select`` cannot see
    them); a line's tail that has not come yet waits for the next call."""
    import selectors
    import time
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            *lines, _PENDING[proc.pid] = _PENDING.get(proc.pid, b"").split(b"\n")
            for k, line in enumerate(lines):
                if line.startswith(b"{"):
                    seen.append(json.loads(line))
                    if done(seen[-1]):
                        rest = b"\n".join(lines[k + 1:])
                        _PENDING[proc.pid] = (rest + b"\n" if rest else b"") + _PENDING[proc.pid]
                        return seen
            if time.monotonic() >= deadline \
                    or not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                return seen
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return seen
            _PENDING[proc.pid] += chunk


_PENDING: dict[int, bytes] = {}  # by client PID: bytes read past the last whole line


def cpp_log_lines(home: Path, *words: str, limit: int = 40) -> list[str]:
    """The lines of the C++ client's own logs under ``home`` (every process started with that
    home) that hold one of ``words``: what a failing test shows of the client's side (its
    heartbeats, check-backs, transport errors)."""
    found: list[str] = []
    for path in sorted((home / "logs" / "rocketmq-cpp").glob("*.log*")):
        with open(path, errors="replace") as f:
            found += [f"{path.name}: {line.rstrip()}" for line in f
                      if any(w in line.lower() for w in words)]
    return found[-limit:]
