"""A NameServer started without TLS maps no OpenSSL (``dledger.openssl``: 7.5 MiB of its RSS) and
loads no ``prometheus_client`` (its ``/metrics`` is our own exposition), checked on a real
process while it serves, through its memory map and Python's own import log
(``PYTHONPROFILEIMPORTTIME``, which names every import, lazy ones included)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.broker.test_broker_footprint import ROOT, imported, libcrypto_mapped


def test_a_namesrv_without_tls_loads_neither_openssl_nor_prometheus_client(tmp_path: Path) -> None:
    log = tmp_path / "namesrv.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "namesrv", "--listen", "127.0.0.1:0",
                                 "--insecure"], stdout=subprocess.PIPE, stderr=err,
                                stdin=subprocess.DEVNULL, cwd=ROOT,
                                env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    try:
        assert proc.stdout is not None
        host, port = json.loads(proc.stdout.readline())["listen"]
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        assert "dledger_namesrv_registrations_total 0.0" in text
        assert not libcrypto_mapped(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    modules = imported(log.read_text(errors="replace"))
    assert "namesrv.metrics" in modules and "aiohttp" in modules
    assert not [m for m in modules if m.split(".")[0] == "prometheus_client"]
