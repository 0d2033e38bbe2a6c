"""The broker's /livez: 200 while the node's log runs, 503 with the failure once it stopped."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from broker.shell.http import make_app


async def _get(server: Any, path: str) -> tuple[int, Any]:
    async with TestClient(TestServer(make_app(server))) as http:
        resp = await http.get(path)
        return resp.status, await resp.json()


def test_livez_is_200_while_the_log_runs_and_503_after_it_failed() -> None:
    node = SimpleNamespace(failure=None)
    server = SimpleNamespace(node=node)
    assert asyncio.run(_get(server, "/livez")) == (200, {"ok": True})
    node.failure = OSError(5, "Input/output error")
    code, body = asyncio.run(_get(server, "/livez"))
    assert code == 503 and body["ok"] is False
    assert body["failure"].startswith("OSError:") and "Input/output error" in body["failure"]
