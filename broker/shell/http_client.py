"""A small HTTP/1.1 client on asyncio streams: what a broker node's registrar speaks to the
NameServers with (``broker.shell.registrar``), so that the broker process needs no HTTP library.

Owns connections: one request at a time on each, a deadline for the whole of each request
(connecting, TLS, writing, the answer), TLS with the caller's ``ssl.SSLContext`` for ``https://``
URLs (the server's certificate and host name verified as the context says), and reuse of a
kept-alive connection for the next request to the same origin (at most ``IDLE_PER_ORIGIN_MAX``
kept, none older than ``IDLE_KEPT_S``: under the servers' keep-alive timeouts). The messages'
rules are ``protocol.http1``'s; a response's body is framed by ``Content-Length`` or runs to
the end of the connection, and is at most ``RESPONSE_BYTES_MAX``.

Every failure is one named error, ``HttpClientError`` (``HttpTimeoutError`` when the deadline
passed), its cause chained: the caller need not know asyncio's or ssl's exceptions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from protocol.errors import DLedgerError
from protocol.http1 import (
    LINE_BYTES_MAX,
    HeadCollector,
    Headers,
    HttpProtocolError,
    ResponseHead,
    body_length,
    format_request,
    parse_response_head,
)

if TYPE_CHECKING:
    import ssl

__all__ = ["HttpClient", "HttpClientError", "HttpResponse", "HttpTimeoutError"]

IDLE_KEPT_S = 15.0  # a kept connection older than this is closed rather than reused
IDLE_PER_ORIGIN_MAX = 4
RESPONSE_BYTES_MAX = 1 << 20
INFORMATIONAL_MAX = 4  # 1xx answers skipped before the response


class HttpClientError(DLedgerError):
    """A request that got no usable answer: a bad URL, refused or reset, a TLS failure, a
    malformed or oversized response (the message says which)."""


class HttpTimeoutError(HttpClientError):
    """No whole answer within the request's deadline."""


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    headers: Headers
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


@dataclass(slots=True)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since_s: float = field(default=0.0)

    def usable(self, now_s: float) -> bool:
        return (not self.reader.at_eof() and not self.writer.is_closing()
                and now_s - self.idle_since_s < IDLE_KEPT_S)


class HttpClient:
    """Requests to any number of origins; ``close()`` closes the kept connections."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.ssl_context = ssl_context
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}

    async def request(self, method: str, url: str, *, body: bytes = b"",
                      headers: Mapping[str, str] | None = None,
                      timeout_s: float) -> HttpResponse:
        """``method`` of ``url`` with ``body``, answered within ``timeout_s``."""
        try:
            parts = urlsplit(url)
            scheme, host, port = parts.scheme, parts.hostname, parts.port
        except ValueError as err:
            raise HttpClientError(f"bad URL {url!r}: {err}") from err
        if scheme not in ("http", "https") or not host:
            raise HttpClientError(f"bad URL {url!r}: want http://host:port/path or https://...")
        origin = (scheme, host, port or (443 if scheme == "https" else 80))
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            raw = format_request(method, target, parts.netloc, headers or {}, body)
        except ValueError as err:
            raise HttpClientError(f"cannot send {method} {url}: {err}") from err
        try:
            async with asyncio.timeout(timeout_s):
                return await self._exchange(origin, raw, method == "HEAD")
        except TimeoutError as err:
            raise HttpTimeoutError(f"{method} {url}: no answer within {timeout_s:g} s") from err
        except (OSError, EOFError, asyncio.LimitOverrunError, HttpProtocolError) as err:
            raise HttpClientError(f"{method} {url}: {_why(err)}") from err

    async def close(self) -> None:
        for kept in self._idle.values():
            for conn in kept:
                conn.writer.close()
        self._idle.clear()

    async def _exchange(self, origin: tuple[str, str, int], raw: bytes,
                        head_only: bool) -> HttpResponse:
        conn = self._kept(origin) or await self._connect(origin)
        try:
            conn.writer.write(raw)
            await conn.writer.drain()
            head, body, keep_alive = await _read_response(conn.reader, head_only)
        except BaseException:
            conn.writer.close()  # (cancelled by the deadline too: its state is unknown)
            raise
        if keep_alive:
            self._keep(origin, conn)
        else:
            conn.writer.close()
        return HttpResponse(head.status, head.headers, body)

    async def _connect(self, origin: tuple[str, str, int]) -> _Connection:
        scheme, host, port = origin
        tls: ssl.SSLContext | bool | None = None
        if scheme == "https":
            tls = self.ssl_context if self.ssl_context is not None else True
        reader, writer = await asyncio.open_connection(
            host, port, ssl=tls, server_hostname=host if tls else None, limit=LINE_BYTES_MAX)
        return _Connection(reader, writer)

    def _kept(self, origin: tuple[str, str, int]) -> _Connection | None:
        kept = self._idle.get(origin, [])
        now_s = time.monotonic()
        while kept:
            conn = kept.pop()
            if conn.usable(now_s):
                return conn
            conn.writer.close()
        return None

    def _keep(self, origin: tuple[str, str, int], conn: _Connection) -> None:
        kept = self._idle.setdefault(origin, [])
        if len(kept) >= IDLE_PER_ORIGIN_MAX:
            conn.writer.close()
            return
        conn.idle_since_s = time.monotonic()
        kept.append(conn)


async def _read_response(reader: asyncio.StreamReader,
                         head_only: bool) -> tuple[ResponseHead, bytes, bool]:
    """The response's head, its body, and whether the connection can carry another request."""
    for _ in range(INFORMATIONAL_MAX + 1):
        collector = HeadCollector()
        while True:
            try:
                line = await reader.readuntil(b"\n")
            except asyncio.LimitOverrunError:
                raise HttpProtocolError(431, f"a response line is longer than {LINE_BYTES_MAX} "
                                             "bytes") from None
            if collector.add(line):
                break
        head = parse_response_head(collector.lines)
        if not 100 <= head.status < 200:
            break
    else:
        raise HttpProtocolError(400, f"more than {INFORMATIONAL_MAX} informational responses")
    if head_only or head.status in (204, 304):
        return head, b"", head.keep_alive
    length = body_length(head.headers)
    if length is None:  # the body runs to the end of the connection
        body = await reader.read(RESPONSE_BYTES_MAX + 1)
        while len(body) <= RESPONSE_BYTES_MAX and not reader.at_eof():
            more = await reader.read(RESPONSE_BYTES_MAX + 1 - len(body))
            if not more:
                break
            body += more
        if len(body) > RESPONSE_BYTES_MAX:
            raise HttpProtocolError(413, f"a response body over {RESPONSE_BYTES_MAX} bytes")
        return head, body, False
    if length > RESPONSE_BYTES_MAX:
        raise HttpProtocolError(413, f"a response body of {length} bytes: at most "
                                     f"{RESPONSE_BYTES_MAX}")
    return head, await reader.readexactly(length), head.keep_alive


def _why(err: BaseException) -> str:
    if isinstance(err, asyncio.IncompleteReadError):
        return "the server closed the connection before a whole answer"
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
