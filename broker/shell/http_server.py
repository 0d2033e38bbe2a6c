"""A small HTTP/1.1 server on asyncio streams: what serves a broker node's admin endpoints
(``broker.shell.http``), so that the broker process needs no web framework.

Owns connections and their bounds; the messages' rules are ``protocol.http1``'s. Serves GET (and
HEAD, the same answer without its body) of a fixed set of paths, one request after another on a
kept-alive connection, each answered with a ``Content-Length`` body. Bad input gets a named
answer and the connection closes: 400 malformed, 404 an unknown path (the connection stays),
405 another method (stays), 408 a head or body that does not arrive within ``head_timeout_s``,
413 a body over ``body_bytes_max`` (bodies are read and dropped: no endpoint takes one), 414/431
a head too large, 501 a ``Transfer-Encoding``, 503 past ``connections_max`` connections. An
idle connection closes after ``idle_timeout_s``; an answer that cannot be written within
``write_timeout_s`` closes it too. TLS when started with an ``ssl.SSLContext`` (the node's
``--tls-*``). Must not: decide anything about the node (its handlers do), or block the loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from protocol.http1 import (
    LINE_BYTES_MAX,
    HeadCollector,
    Headers,
    HttpProtocolError,
    RequestHead,
    body_length,
    format_response,
    parse_request_head,
)
from protocol.tls import SSLError

if TYPE_CHECKING:
    import ssl

__all__ = ["Handler", "HttpServer", "Request", "Response", "json_response"]

log = logging.getLogger("broker.shell.http_server")

IDLE_TIMEOUT_S = 75.0  # a kept-alive connection with no request (a scrape every 15-60 s reuses it)
HEAD_TIMEOUT_S = 10.0  # a request's head and body, from its first byte
WRITE_TIMEOUT_S = 10.0  # an answer into a connection that does not read
LINGER_S = 1.0  # reading what a refused client still sends, before closing its connection
LINGER_READS_MAX = 64  # (of up to 64 KiB each)
BODY_BYTES_MAX = 64 << 10
CONNECTIONS_MAX = 256
JSON = "application/json; charset=utf-8"
ANSWERED_METHODS = ("GET", "HEAD")


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    headers: Headers
    remote: str  # the peer's host, "" when unknown


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = JSON


def json_response(data: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(data).encode())


Handler = Callable[[Request], Awaitable[Response]]


class HttpServer:
    """Answers GET and HEAD of ``routes`` (path -> handler) on one listener."""

    def __init__(self, routes: Mapping[str, Handler], *, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 head_timeout_s: float = HEAD_TIMEOUT_S,
                 write_timeout_s: float = WRITE_TIMEOUT_S, body_bytes_max: int = BODY_BYTES_MAX,
                 connections_max: int = CONNECTIONS_MAX) -> None:
        self.routes = dict(routes)
        self.idle_timeout_s = idle_timeout_s
        self.head_timeout_s = head_timeout_s
        self.write_timeout_s = write_timeout_s
        self.body_bytes_max = body_bytes_max
        self.connections_max = connections_max
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}

    async def start(self, host: str, port: int,
                    ssl_context: ssl.SSLContext | None = None) -> tuple[str, int]:
        """Listen; the address bound (port 0 picks a free one)."""
        self._server = await asyncio.start_server(
            self._serve, host, port, ssl=ssl_context, limit=LINE_BYTES_MAX,
            ssl_handshake_timeout=self.head_timeout_s if ssl_context is not None else None)
        bound = self._server.sockets[0].getsockname()
        return bound[0], bound[1]

    async def close(self) -> None:
        """Stop listening and close every connection (their tasks end on the closed streams;
        any still running after ``write_timeout_s`` is cancelled)."""
        if self._server is None:
            return
        self._server.close()
        for writer in self._connections.values():
            writer.close()
        if self._connections:
            _, late = await asyncio.wait(list(self._connections), timeout=self.write_timeout_s)
            for task in late:
                task.cancel()
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        remote = str(peer[0]) if isinstance(peer, tuple) else ""
        self._connections[task] = writer  # (close() closes it, the refused ones too)
        try:
            if len(self._connections) > self.connections_max:
                await self._send(writer, _error(503, f"{self.connections_max} admin connections "
                                                     "are open: try again"), False, False)
                await _linger(reader, writer)
                return
            keep_alive = True
            while keep_alive:  # one request a pass, until the client or a bound ends it
                keep_alive = await self._one(reader, writer, remote)
        except (ConnectionError, TimeoutError, SSLError):
            pass  # the client went away or stopped reading: nothing to answer
        finally:
            self._connections.pop(task, None)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   remote: str) -> bool:
        """Read one request and answer it; whether the connection stays open."""
        try:
            head = await self._read_request(reader)
        except HttpProtocolError as err:
            await self._send(writer, _error(err.status, str(err)), False, False)
            await _linger(reader, writer)
            return False
        except asyncio.IncompleteReadError:
            return False  # closed mid-request
        if head is None:
            return False  # closed or idle between requests
        response = await self._answer(head, remote)
        keep_alive = head.keep_alive
        await self._send(writer, response, keep_alive, head.method == "HEAD")
        return keep_alive

    async def _read_request(self, reader: asyncio.StreamReader) -> RequestHead | None:
        """The next request's head, its body read and dropped; None: the client closed, or sent
        nothing for ``idle_timeout_s``."""
        try:
            async with asyncio.timeout(self.idle_timeout_s):
                first = await reader.readexactly(1)
        except (TimeoutError, asyncio.IncompleteReadError):
            return None
        collector = HeadCollector()
        try:
            async with asyncio.timeout(self.head_timeout_s):
                line = first if first == b"\n" else first + await _line(reader, collector)
                while not collector.add(line):
                    line = await _line(reader, collector)
                head = parse_request_head(collector.lines)
                length = body_length(head.headers) or 0
                if length > self.body_bytes_max:
                    raise HttpProtocolError(413, f"a body of {length} bytes: at most "
                                                 f"{self.body_bytes_max}, and none is needed")
                if length:
                    await reader.readexactly(length)
        except TimeoutError:
            raise HttpProtocolError(408, f"the request did not arrive within "
                                         f"{self.head_timeout_s:g} s") from None
        return head

    async def _answer(self, head: RequestHead, remote: str) -> Response:
        handler = self.routes.get(head.path)
        if handler is None:
            return _error(404, f"no such path {head.path[:100]}: the paths are "
                               f"{', '.join(sorted(self.routes))}")
        if head.method not in ANSWERED_METHODS:
            return _error(405, f"{head.method} is not answered here: GET or HEAD")
        try:
            return await handler(Request(head.method, head.path, head.headers, remote))
        except Exception:  # a handler's bug: answered 500, logged with its traceback
            log.exception("the admin endpoint %s failed", head.path)
            return _error(500, f"{head.path} failed: see the node's log")

    async def _send(self, writer: asyncio.StreamWriter, response: Response, keep_alive: bool,
                    head_only: bool) -> None:
        headers = {"Content-Type": response.content_type}
        if response.status == 405:
            headers["Allow"] = ", ".join(ANSWERED_METHODS)
        writer.write(format_response(response.status, response.body, headers,
                                     keep_alive=keep_alive, head_only=head_only))
        async with asyncio.timeout(self.write_timeout_s):
            await writer.drain()


async def _line(reader: asyncio.StreamReader, collector: HeadCollector) -> bytes:
    """One line of a head, up to its ``\\n``, within ``LINE_BYTES_MAX`` (the reader's limit)."""
    try:
        return await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise collector.line_too_long() from None


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Before closing a connection whose request was refused: read and drop what the client
    still sends, for ``LINGER_S`` at most. Closing a socket with unread input resets the
    connection, and the client could lose the answer with it."""
    if writer.can_write_eof():
        writer.write_eof()  # (the client reads the answer to its end, then closes)
    try:
        async with asyncio.timeout(LINGER_S):
            for _ in range(LINGER_READS_MAX):
                if not await reader.read(64 << 10):
                    return
    except TimeoutError:
        return  # the client keeps it open: closed now, whatever it sends


def _error(status: int, message: str) -> Response:
    return json_response({"error": message}, status)
