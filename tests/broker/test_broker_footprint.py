"""A broker process without the gRPC listener loads neither ``aiohttp`` nor ``prometheus_client``
(issue 37: together 15.7 MiB of a node's start): its admin endpoints, metrics and registrar are
the broker's own (``broker.shell``); nor ``importlib.metadata`` (the version is
``dledger.__version__``) nor ``tomllib`` (read only with ``--config``). Checked on the entry
modules in a fresh interpreter, and on real nodes of a group, through Python's own import log
(``PYTHONPROFILEIMPORTTIME``), which names every import a process makes, lazy ones included,
while they serve every endpoint, register, take sends and pulls and stop."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.shell.http_client import HttpClient
from client import PullConsumer
from protocol.cluster_key import CLUSTER_KEY_ENV, status_headers
from tests.clusters import namesrv_group

# (importlib.metadata: 3.5 MiB with the email, zipfile and csv modules it brings; tomllib: only
# with --config)
NOT_LOADED = ("aiohttp", "prometheus_client", "importlib.metadata", "tomllib")
ROOT = Path(__file__).resolve().parents[2]


def offenders(modules: list[str]) -> list[str]:
    return sorted(m for m in modules if any(m == x or m.startswith(x + ".") for x in NOT_LOADED))


def test_the_broker_entry_modules_import_neither() -> None:
    code = ("import json, sys\nimport broker.__main__, broker.server\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    assert "broker.shell.http_server" in loaded and "broker.shell.exposition" in loaded
    assert offenders(loaded) == []


def imported(log_text: str) -> list[str]:
    """The modules an import log (``PYTHONPROFILEIMPORTTIME``'s lines on stderr) names."""
    return [line.rsplit("|", 1)[1].strip() for line in log_text.splitlines()
            if line.startswith("import time:") and line.count("|") == 2]


@pytest.mark.slow
def test_running_nodes_import_neither(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # (read by the processes started here)
    with namesrv_group(tmp_path, "--protect-status") as (ns, cluster):  # registered, a send routed
        asyncio.run(_use_every_endpoint(ns, [s.ready["admin"] for s in cluster.servers.values()]))
        logs = [Path(s.log_path) for s in cluster.servers.values()]
    for log in logs:  # read after the nodes stopped: their unregistration is in
        modules = imported(log.read_text(errors="replace"))
        assert "broker.shell.registrar" in modules and "asyncio" in modules, log
        assert offenders(modules) == [], log


async def _use_every_endpoint(ns: str, admins: list[list[object]]) -> None:
    key = os.environ[CLUSTER_KEY_ENV].encode()  # (every process's: tests/conftest.py)
    http = HttpClient()
    for host, port in admins:
        base = f"http://{host}:{port}"
        for path in ("/livez", "/readyz", "/metrics"):
            resp = await http.request("GET", base + path, timeout_s=10)
            assert resp.status in (200, 503), (path, resp.status)
        signed = status_headers(key, int(time.time() * 1000))
        resp = await http.request("GET", base + "/status", headers=signed, timeout_s=10)
        assert resp.status == 200 and "raft" in json.loads(resp.body)
    await http.close()
    async with PullConsumer(ns, "footprint") as consumer:
        for mq in await consumer.fetch_queues("warmup"):
            await consumer.pull(mq, 0, 32)
