"""``--protect-status``: a broker's ``/status`` answers only a read signed with the cluster
credential; the NameServer's console and ``dledger status`` (the credential in its
environment) sign theirs and see the group; the health probes and ``/metrics`` stay open."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from protocol.cluster_key import CLUSTER_KEY_ENV, sign_headers, status_headers
from tests.clusters import namesrv_group
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow


def test_status_answers_signed_reads_only_and_the_cluster_tools_sign_theirs(
        tmp_path: Path) -> None:
    key = os.environ[CLUSTER_KEY_ENV].encode()  # (tests/conftest.py: every process's)
    with namesrv_group(tmp_path, "--protect-status") as (ns, cluster):
        admins = [s.ready["admin"] for s in cluster.servers.values()]
        asyncio.run(_reads(ns, [f"http://{a[0]}:{a[1]}" for a in admins], key))
        out = subprocess.run([sys.executable, "-c", "import cli; cli.main()", "status",
                              "--namesrv", ns], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "leader" in out.stdout, out.stdout + out.stderr
        bare = {k: v for k, v in os.environ.items() if k != CLUSTER_KEY_ENV}
        out = subprocess.run([sys.executable, "-c", "import cli; cli.main()", "status",
                              "--namesrv", ns], capture_output=True, text=True, timeout=60,
                             env=bare)
        assert out.returncode != 0 and "unreachable" in out.stdout, out.stdout + out.stderr


async def _reads(ns: str, admins: list[str], key: bytes) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        for base in admins:
            async with http.get(base + "/status") as resp:
                assert resp.status == 401 and "must be signed" in (await resp.json())["error"]
            wrong = sign_headers(b"w" * 40, "GET", "/status", "status/reader", b"",
                                 int(time.time() * 1000))
            async with http.get(base + "/status", headers=wrong) as resp:
                assert resp.status == 403
            signed = status_headers(key, int(time.time() * 1000))
            async with http.get(base + "/status", headers=signed) as resp:
                assert resp.status == 200 and "raft" in await resp.json()
            async with http.get(base + "/status", headers=signed) as resp:
                assert resp.status == 403 and "replayed" in (await resp.json())["error"]
            for open_path in ("/livez", "/metrics"):
                async with http.get(base + open_path) as resp:
                    assert resp.status == 200, open_path

            async def ready(url: str = base + "/readyz") -> bool:
                async with http.get(url) as resp:  # (503 while the node catches up: unsigned
                    assert resp.status in (200, 503)  # either way, never 401 or 403)
                    return resp.status == 200 and (await resp.json())["ready"] is True
            # (waited for: a CI run under load once found a node not yet caught up)
            await wait_until(ready, 30.0, f"{base}/readyz answering 200")
        # The console reads every node's status, signed. Waited for: a CI run under load once
        # saw the group "no quorum" in a single look taken just after the cluster came up.
        seen: list[Any] = []

        async def healthy() -> bool:
            async with http.get(f"http://{ns}/console/api/snapshot") as resp:
                seen[:] = (await resp.json())["groups"]
            return len(seen) == 1 and seen[0]["health"] == "ok" and seen[0]["leader"] is not None
        try:
            await wait_until(healthy, 30.0, "the console's view of the group")
        except AssertionError as err:
            raise AssertionError(f"{err}: {seen}") from None
