"""The real RocketMQ 4.x clients the tests drive, each in an environment of its own that
``make clients`` makes (``.venv-clients/``; ``make test`` makes it first): the C++ client's
Python wrapper (``cpp_client.py`` runs in it) and ali-ons in JavaScript (``ali_client.js``).
Missing, a test is skipped saying so, or fails under ``CI``, which must have made it."""

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
CPP_CLIENT = Path(__file__).with_name("cpp_client.py")
ALI_ONS_DIR = REPO / ".venv-clients" / "ali-ons"
ALI_CLIENT = Path(__file__).with_name("ali_client.js")


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
    if not (ALI_ONS_DIR / "node_modules" / "ali-ons" / "package.json").exists():
        _missing(ALI_ONS_DIR, "run `make clients` (npm and Node 20)")
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home), "ALI_ONS_DIR": str(ALI_ONS_DIR)}
    return subprocess.Popen(["node", str(ALI_CLIENT), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(home))


def cpp(home: Path, *args: str) -> subprocess.Popen[str]:
    """``cpp_client.py ARGS`` started (its logs under ``home``/logs, as the C++ client keeps
    them under $HOME); read its JSON lines with ``events``, stop it by its PID."""
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": ""}
    return subprocess.Popen([cpp_python(), str(CPP_CLIENT), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(home))


def finish(proc: subprocess.Popen[str], timeout_s: float) -> list[dict[str, Any]]:
    """The JSON lines of a client that ends by itself within ``timeout_s`` (killed past it)."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=10)
    if proc.returncode != 0:
        sys.stderr.write(err[-4000:])
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def read_until(proc: subprocess.Popen[str], done: Any, timeout_s: float) -> list[dict[str, Any]]:
    """The JSON lines a running client prints until ``done(line)`` holds for one (a deadline:
    ``timeout_s``; the lines so far are returned either way)."""
    import selectors
    import time
    assert proc.stdout is not None
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                break
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("{"):
                seen.append(json.loads(line))
                if done(seen[-1]):
                    break
    return seen
