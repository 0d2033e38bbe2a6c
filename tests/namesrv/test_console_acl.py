"""The console with access control on: the NameServer reads the cluster with its own read-only
account, so a viewer who has not signed in can look but not act (403, AccessDeniedError); an
action signed in as an admin (the page's headers) goes through; a wrong secret is refused by
name and changes nothing."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from broker.features.acl.model import SUB, Account
from client import Credentials
from client.cluster.routes import Routes
from dledger.localcluster import LocalCluster
from namesrv.console import ACCESS_KEY_HEADER, SECRET_KEY_HEADER
from protocol import broker_kinds as bp
from tests.broker.test_broker_processes import BROKER, _start_namesrv
from tests.clusters import registered_group, routed

pytestmark = pytest.mark.slow

ROOT = Credentials("root", "root-secret-1")
VIEWER = Credentials("viewer", "viewer-secret-1")  # what the NameServer reads the cluster with
TIMEOUT = aiohttp.ClientTimeout(total=30)


async def call(s: aiohttp.ClientSession, method: str, url: str, body: Any = None,
               who: Credentials | tuple[str, str] | None = None) -> tuple[int, Any]:
    key, secret = (who.access_key, who.secret_key) if isinstance(who, Credentials) else who or ("", "")
    headers = {ACCESS_KEY_HEADER: key, SECRET_KEY_HEADER: secret} if who else {}
    async with s.request(method, url, json=body, headers=headers) as resp:
        return resp.status, await resp.json()


def test_viewers_look_and_only_a_signed_in_admin_acts(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLEDGER_ACCESS_KEY", VIEWER.access_key)  # the NameServer's own account
    monkeypatch.setenv("DLEDGER_SECRET_KEY", VIEWER.secret_key)
    ns_proc, ns = _start_namesrv(tmp_path)
    try:
        monkeypatch.setenv("DLEDGER_ACL_SECRET_ROOT", ROOT.secret_key)
        monkeypatch.setenv("DLEDGER_ACCESS_KEY", ROOT.access_key)  # the routing warm-up
        monkeypatch.setenv("DLEDGER_SECRET_KEY", ROOT.secret_key)
        with LocalCluster(str(tmp_path / "a"), size=3, tick_ms=50, group="a",
                          program=(*BROKER, "--acl", "--acl-admin-key", "root", "--namesrv", ns,
                                   "--register-interval-s", "1")):
            asyncio.run(routed(ns))
            for var in ("DLEDGER_ACCESS_KEY", "DLEDGER_SECRET_KEY"):
                monkeypatch.delenv(var)
            assert "DLEDGER_ACCESS_KEY" not in os.environ
            asyncio.run(_scenario(ns))
    finally:
        ns_proc.terminate()
        ns_proc.wait(timeout=10)


async def _scenario(ns: str) -> None:
    routes = Routes(ns, credentials=ROOT)
    await routes.start()
    try:
        g = await registered_group(routes)
        viewer = Account(VIEWER.access_key, VIEWER.secret_key, default_topic_perm=SUB)
        await routes.group_client(g).call_leader(bp.ACL_PUT, viewer.row())
    finally:
        await routes.close()
    base = f"http://{ns}/console/api"
    topic = {"mode": "create", "name": "made-in-console", "read_queues": 2, "write_queues": 2,
             "perm": 6}
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        status, body = await call(s, "GET", f"{base}/topics")  # the NameServer's account reads
        assert status == 200, body
        status, body = await call(s, "POST", f"{base}/topics", topic)  # not signed in
        assert status == 403 and body["error_type"] == "AccessDeniedError", body
        assert "admin operation" in body["error"]
        status, body = await call(s, "POST", f"{base}/topics", topic,
                                  Credentials("root", "not-the-secret"))
        assert status == 403 and body["error_type"] == "SignatureError", body
        status, body = await call(s, "GET", f"{base}/topics?topic=made-in-console")
        assert status == 404 or body["topics"] == [], body  # nothing was made
        status, body = await call(s, "POST", f"{base}/topics", topic, ROOT)  # signed in
        assert status == 200 and body["ok"], body
        status, body = await call(s, "POST", f"{base}/topics", topic, ("x y", "secret-1234"))
        assert status == 400 and "sign-in" in body["error"], body
