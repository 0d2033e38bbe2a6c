"""The registrar's HTTP client (``broker.shell.http_client``) against small scripted servers: a
POST arrives whole; a kept-alive connection is reused; each failure is one named error
(refused, no answer by the deadline, a malformed or chunked answer); a body without a length
runs to the end of the connection."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from broker.shell.http_client import HttpClient, HttpClientError, HttpTimeoutError
from protocol.http1 import HeadCollector, body_length, parse_request_head

HOST = "127.0.0.1"
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def scripted(script: Script) -> AsyncIterator[tuple[str, list[int]]]:
    """A server running ``script`` on each connection; yields its URL and a list that gets one
    item per connection opened."""
    opened: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened.append(1)
        try:
            await script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: the script's job ends with it
        finally:
            writer.close()

    server = await asyncio.start_server(serve, HOST, 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://{HOST}:{port}", opened
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> tuple[str, bytes]:
    collector = HeadCollector()
    for _ in range(200):  # bounded: a head of at most 200 lines here
        if collector.add(await reader.readuntil(b"\n")):
            break
    head = parse_request_head(collector.lines)
    body = await reader.readexactly(body_length(head.headers) or 0)
    return f"{head.method} {head.target} {head.headers.get('X-Test', '')}", body


def test_a_post_arrives_whole_and_a_kept_connection_is_reused() -> None:
    got: list[tuple[str, bytes]] = []

    async def answer_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(10):
            got.append(await read_request(reader))
            writer.write(b"HTTP/1.1 200 OK\r\nX-NameServer-Boot-Id: b1\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    async def run() -> int:
        async with scripted(answer_each) as (url, opened):
            http = HttpClient()
            first = await http.request("POST", url + "/v1/brokers/register", body=b'{"a":1}',
                                       headers={"X-Test": "t1"}, timeout_s=10)
            second = await http.request("GET", url + "/livez", timeout_s=10)
            await http.close()
        assert (first.status, first.text(), first.headers["x-nameserver-boot-id"]) == (200, "ok", "b1")
        assert second.body == b"ok"
        return len(opened)

    assert asyncio.run(run()) == 1  # the second request went on the first's connection
    assert got == [("POST /v1/brokers/register t1", b'{"a":1}'), ("GET /livez ", b"")]


@pytest.mark.parametrize("answer, why", [
    (b"garbage\r\n\r\n", "malformed status line"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
     "Transfer-Encoding"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "closed the connection"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n", "at most"),
])
def test_a_bad_answer_is_a_named_error(answer: bytes, why: str) -> None:
    async def say(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)
        await writer.drain()

    async def run() -> None:
        async with scripted(say) as (url, _):
            with pytest.raises(HttpClientError, match=why):
                await HttpClient().request("GET", url + "/livez", timeout_s=10)
    asyncio.run(run())


def test_no_answer_by_the_deadline_and_a_refused_connection_are_named() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # reads the request, never answers, until the client leaves

    with socket.socket() as s:  # a port nothing listens on once this closes
        s.bind((HOST, 0))
        closed_port = s.getsockname()[1]

    async def run() -> None:
        http = HttpClient()
        async with scripted(silent) as (url, _):
            with pytest.raises(HttpTimeoutError, match=r"no answer within 0\.3 s"):
                await http.request("GET", url + "/livez", timeout_s=0.3)
        with pytest.raises(HttpClientError, match="ConnectionRefusedError"):
            await http.request("GET", f"http://{HOST}:{closed_port}/livez", timeout_s=10)
        for bad in ("ftp://h/x", "http:///x", "http://h:99999/x"):
            with pytest.raises(HttpClientError, match="bad URL"):
                await http.request("GET", bad, timeout_s=10)
    asyncio.run(run())


def test_a_body_without_a_length_runs_to_the_end_of_the_connection() -> None:
    async def then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nall of it")
        await writer.drain()

    async def run() -> None:
        async with scripted(then_close) as (url, _):
            resp = await HttpClient().request("GET", url + "/x", timeout_s=10)
            assert (resp.status, resp.body) == (200, b"all of it")
    asyncio.run(run())
