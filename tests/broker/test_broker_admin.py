"""A broker node's admin HTTP endpoints (``broker.shell.http``) on their own server
(``broker.shell.http_server``): /livez says whether the log runs; a kept-alive connection
answers one request after another, HEAD too; bad input gets its named status (400, 404, 405,
408, 413, 414, 431, 501, 503, 505) and a JSON error; a handler's failure is a 500; closing the
server closes its connections; TLS with the node's certificate."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from broker.shell.http import make_routes
from broker.shell.http_client import HttpClient, HttpClientError
from broker.shell.http_server import HttpServer, Request, Response, json_response
from dledger.network.tls_certs import make_ca, make_node_cert
from protocol.http1 import LINE_BYTES_MAX
from protocol.tls import TlsConfig, client_context, tls_failure

HOST = "127.0.0.1"


@asynccontextmanager
async def serving(routes: dict[str, Callable[[Request], Awaitable[Response]]],
                  ssl_context: ssl.SSLContext | None = None,
                  **bounds: Any) -> AsyncIterator[tuple[str, int]]:
    server = HttpServer(routes, **bounds)
    address = await server.start(HOST, 0, ssl_context)
    try:
        yield address
    finally:
        await server.close()


async def _echo(request: Request) -> Response:
    return json_response({"path": request.path, "remote": request.remote})


async def _broken(_: Request) -> Response:
    raise RuntimeError("a bug in a handler")


ROUTES = {"/echo": _echo, "/broken": _broken}


async def exchange(address: tuple[str, int], raw: bytes) -> bytes:
    """Send ``raw`` on a new connection and read until the server closes it (10 s at most)."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(raw)
        await writer.drain()
        async with asyncio.timeout(10):
            return await reader.read()
    finally:
        writer.close()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_livez_is_200_while_the_log_runs_and_503_after_it_failed() -> None:
    node = SimpleNamespace(failure=None)
    host = SimpleNamespace(node=node)

    async def get() -> tuple[int, Any]:
        async with serving(make_routes(host)) as (h, p):  # type: ignore[arg-type]
            http = HttpClient()
            resp = await http.request("GET", f"http://{h}:{p}/livez", timeout_s=10)
            await http.close()
            assert resp.headers["Content-Type"] == "application/json; charset=utf-8"
            return resp.status, json.loads(resp.body)

    assert asyncio.run(get()) == (200, {"ok": True})
    node.failure = OSError(5, "Input/output error")
    code, body = asyncio.run(get())
    assert code == 503 and body["ok"] is False
    assert body["failure"].startswith("OSError:") and "Input/output error" in body["failure"]


def test_one_connection_carries_request_after_request_and_head_has_no_body() -> None:
    async def run() -> None:
        async with serving(ROUTES) as address:
            reader, writer = await asyncio.open_connection(*address)
            writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"
                         b"HEAD /echo HTTP/1.1\r\n\r\n"
                         b"GET /nowhere HTTP/1.1\r\n\r\n"
                         b"DELETE /echo HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
                         b"GET /echo HTTP/1.0\r\n\r\n")
            async with asyncio.timeout(10):
                answers = (await reader.read()).split(b"HTTP/1.1 ")[1:]
            writer.close()
        body = json.dumps({"path": "/echo", "remote": HOST}).encode()
        assert answers[0].startswith(b"200 OK\r\n") and answers[0].endswith(b"\r\n\r\n" + body)
        assert answers[1].startswith(b"200 OK\r\n") and answers[1].endswith(b"\r\n\r\n")
        assert f"Content-Length: {len(body)}".encode() in answers[1]  # HEAD: GET's length
        assert answers[2].startswith(b"404 ") and b"/echo" in answers[2]  # (the paths named)
        assert answers[3].startswith(b"405 ") and b"Allow: GET, HEAD" in answers[3]
        assert answers[4].startswith(b"200 OK") and b"Connection: close" in answers[4]
        assert len(answers) == 5  # HTTP/1.0 without keep-alive: closed after the fifth
    asyncio.run(run())


def test_bad_requests_get_their_status_and_a_json_error_then_the_connection_closes() -> None:
    cases = {
        b"NONSENSE\r\n\r\n": 400,
        b"GET /echo HTTP/1.1\r\nNo colon here\r\n\r\n": 400,
        b"GET /echo HTTP/2.0\r\n\r\n": 505,
        b"GET /" + b"a" * LINE_BYTES_MAX + b" HTTP/1.1\r\n\r\n": 414,
        b"GET /echo HTTP/1.1\r\nA: " + b"b" * LINE_BYTES_MAX + b"\r\n\r\n": 431,
        b"GET /echo HTTP/1.1\r\n" + b"A: b\r\n" * 200 + b"\r\n": 431,
        b"GET /echo HTTP/1.1\r\nContent-Length: 70000\r\n\r\n": 413,
        b"GET /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n": 501,
        b"GET /echo HTTP/1.1\r\nHost: x\r\n": 408,  # the head never ends
        b"GET /broken HTTP/1.1\r\nConnection: close\r\n\r\n": 500,
    }

    async def run() -> dict[bytes, bytes]:
        async with serving(ROUTES, head_timeout_s=0.5) as address:
            return {raw: await exchange(address, raw) for raw in cases}

    for raw, answer in asyncio.run(run()).items():
        assert status_of(answer) == cases[raw], (raw[:60], answer[:200])
        head, _, body = answer.partition(b"\r\n\r\n")
        assert b"Connection: close" in head and json.loads(body)["error"], answer[:200]


def test_idle_connections_close_and_connections_past_the_limit_get_503() -> None:
    async def run() -> None:
        async with serving(ROUTES, idle_timeout_s=0.3, connections_max=1) as address:
            reader, writer = await asyncio.open_connection(*address)
            writer.write(b"GET /echo HTTP/1.1\r\n\r\n")
            async with asyncio.timeout(10):
                assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 200")
                refused = await exchange(address, b"GET /echo HTTP/1.1\r\n\r\n")
                assert status_of(refused) == 503 and b"1 admin connections" in refused
                await reader.read()  # the idle connection is closed by the server
            writer.close()
            assert status_of(await exchange(address, b"GET /echo HTTP/1.0\r\n\r\n")) == 200
    asyncio.run(run())


def test_closing_the_server_closes_its_kept_connections(caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> bytes:
        async with serving(ROUTES) as address:
            reader, writer = await asyncio.open_connection(*address)
            writer.write(b"GET /echo HTTP/1.1\r\n\r\n")
            async with asyncio.timeout(10):
                await reader.readuntil(b"}")  # the whole answer: its JSON body ends there
        async with asyncio.timeout(10):
            rest = await reader.read()  # the server closed it (no idle wait)
        writer.close()
        return rest

    assert asyncio.run(run()) == b""
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_the_admin_listener_speaks_tls_with_the_node_certificate(tmp_path: Path) -> None:
    ca = make_ca(str(tmp_path / "ca"))
    cert = make_node_cert(str(tmp_path / "ca"), "n0")
    tls = TlsConfig(cert.cert_file, cert.key_file, ca)
    other_ca = make_ca(str(tmp_path / "other"))

    async def run() -> None:
        async with serving(ROUTES, tls.server_context()) as (h, p):
            trusted = HttpClient(client_context(ca))
            resp = await trusted.request("GET", f"https://{h}:{p}/echo", timeout_s=10)
            assert resp.status == 200 and json.loads(resp.body)["path"] == "/echo"
            await trusted.close()
            stranger = HttpClient(client_context(other_ca))
            with pytest.raises(HttpClientError) as err:
                await stranger.request("GET", f"https://{h}:{p}/echo", timeout_s=10)
            assert "certificate not trusted" in (tls_failure(err.value) or "")
            with pytest.raises(HttpClientError):  # plain HTTP to the TLS listener
                await HttpClient().request("GET", f"http://{h}:{p}/echo", timeout_s=10)
    asyncio.run(run())
