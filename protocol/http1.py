"""HTTP/1.1 messages as bytes, both ways, for a broker node's own small HTTP layer: the admin
endpoints' server (``broker.shell.http_server``) and the NameServer client of its registrar
(``broker.shell.http_client``). Owns collecting a message's head line by line within its bounds
(``HeadCollector``), parsing a request's or a response's head, the body length a head declares,
and writing a request or a response. Pure: no I/O, no asyncio, no clock; the shells move the
bytes and keep the time bounds.

What it accepts is deliberately small (RFC 9112, the part a health probe, Prometheus, a
NameServer and ``dledger status`` use): HTTP/1.0 and 1.1, origin-form targets, bodies framed by
``Content-Length`` only. Every violation raises ``HttpProtocolError`` carrying the status a server
answers it with: 400 a malformed head, 414 a request line longer than ``LINE_BYTES_MAX``, 431 a
header line that long or a head past ``HEAD_BYTES_MAX`` bytes or ``HEADERS_MAX`` fields, 501 a
``Transfer-Encoding`` (chunked bodies are not spoken), 505 an HTTP version other than 1.x.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from protocol.errors import DLedgerError

__all__ = ["HEADERS_MAX", "HEAD_BYTES_MAX", "LINE_BYTES_MAX", "HeadCollector", "Headers",
           "HttpProtocolError", "RequestHead", "ResponseHead", "body_length", "format_request",
           "format_response", "parse_request_head", "parse_response_head"]

LINE_BYTES_MAX = 8 << 10  # one line of a head, its line ending included
HEAD_BYTES_MAX = 16 << 10  # a whole head: request or status line and every field
HEADERS_MAX = 100  # fields in one head
BLANK_LINES_SKIPPED_MAX = 4  # empty lines before a request line (RFC 9112 2.2 allows some)
REASONS = {200: "OK", 204: "No Content", 400: "Bad Request", 401: "Unauthorized",
           403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 413: "Content Too Large", 414: "URI Too Long",
           431: "Request Header Fields Too Large", 500: "Internal Server Error",
           501: "Not Implemented", 503: "Service Unavailable", 505: "HTTP Version Not Supported"}

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 5.6.2
_VERSION = re.compile(rb"HTTP/([0-9])\.([0-9])")
_TARGET = re.compile(rb"/[!-~]*")  # origin-form: no spaces, no controls, ASCII
_FIELD_VALUE_BAD = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # controls but HTAB
_TEXT_BAD = re.compile(r"[\x00-\x1f\x7f]")  # what a field this side writes must not hold


class HttpProtocolError(DLedgerError):
    """An HTTP message that breaks the rules above; ``status`` is the answer a server gives."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Headers(Mapping[str, str]):
    """A head's fields by case-insensitive name (first spelling kept); a repeated field's values
    joined by ", " (RFC 9110 5.3)."""

    __slots__ = ("_fields",)

    def __init__(self, pairs: Iterable[tuple[str, str]] = ()) -> None:
        fields: dict[str, tuple[str, str]] = {}
        for name, value in pairs:
            key = name.lower()
            had = fields.get(key)
            fields[key] = (name, value) if had is None else (had[0], f"{had[1]}, {value}")
        self._fields = fields

    def __getitem__(self, name: str) -> str:
        return self._fields[name.lower()][1]

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._fields.values())

    def __len__(self) -> int:
        return len(self._fields)

    def tokens(self, name: str) -> set[str]:
        """A list-valued field's items, lower case (``Connection: keep-alive, Upgrade``)."""
        return {t.strip().lower() for t in self.get(name, "").split(",") if t.strip()}


class HeadCollector:
    """A head's lines as they arrive (each ``add`` one line read up to and including its
    ``\\n``), within ``HEAD_BYTES_MAX`` and ``HEADERS_MAX``; ``add`` says when the empty line
    that ends the head came. Empty lines before the first are skipped (a few)."""

    __slots__ = ("lines", "_bytes", "_skipped")

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self._bytes = 0
        self._skipped = 0

    def add(self, line: bytes) -> bool:
        """True when ``line`` ends the head. HttpProtocolError past the bounds."""
        text = line[:-2] if line.endswith(b"\r\n") else line.rstrip(b"\n")
        if not text:
            if self.lines:
                return True
            self._skipped += 1
            if self._skipped > BLANK_LINES_SKIPPED_MAX:
                raise HttpProtocolError(400, "empty lines where a request line belongs")
            return False
        self._bytes += len(line)
        if self._bytes > HEAD_BYTES_MAX or len(self.lines) > HEADERS_MAX:
            raise HttpProtocolError(431, f"the head is larger than {HEAD_BYTES_MAX} bytes or "
                                         f"{HEADERS_MAX} fields")
        self.lines.append(text)
        return False

    def line_too_long(self) -> HttpProtocolError:
        """The error for a line with no end within ``LINE_BYTES_MAX`` bytes."""
        if not self.lines:
            return HttpProtocolError(414, f"the request line is longer than {LINE_BYTES_MAX} bytes")
        return HttpProtocolError(431, f"a header line is longer than {LINE_BYTES_MAX} bytes")


@dataclass(frozen=True, slots=True)
class RequestHead:
    method: str
    target: str  # origin-form: the path and any query
    version: tuple[int, int]
    headers: Headers

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def keep_alive(self) -> bool:
        """Whether the connection stays open after the answer (RFC 9112 9.3)."""
        return _keep_alive(self.version, self.headers)


@dataclass(frozen=True, slots=True)
class ResponseHead:
    status: int
    reason: str
    version: tuple[int, int]
    headers: Headers

    @property
    def keep_alive(self) -> bool:
        return _keep_alive(self.version, self.headers)


def _keep_alive(version: tuple[int, int], headers: Headers) -> bool:
    options = headers.tokens("Connection")
    return "close" not in options if version >= (1, 1) else "keep-alive" in options


def _version(raw: bytes) -> tuple[int, int]:
    m = _VERSION.fullmatch(raw)
    if m is None:
        raise HttpProtocolError(400, f"malformed HTTP version {raw[:16]!r}")
    version = (int(m.group(1)), int(m.group(2)))
    if version[0] != 1:
        raise HttpProtocolError(505, f"HTTP/{version[0]}.{version[1]} is not spoken: HTTP/1.1")
    return version


def _fields(lines: list[bytes]) -> Headers:
    pairs = []
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            raise HttpProtocolError(400, "a header line folded onto the next (obsolete folding)")
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None:
            raise HttpProtocolError(400, f"malformed header line {line[:40]!r}")
        value = value.strip(b" \t")
        if _FIELD_VALUE_BAD.search(value) is not None:
            raise HttpProtocolError(400, f"a control character in header {name.decode()}")
        pairs.append((name.decode("ascii"), value.decode("latin-1")))
    return Headers(pairs)


def parse_request_head(lines: list[bytes]) -> RequestHead:
    """A request's head from its lines (``HeadCollector.lines``)."""
    if not lines:
        raise HttpProtocolError(400, "no request line")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or _TOKEN.fullmatch(parts[0]) is None:
        raise HttpProtocolError(400, f"malformed request line {lines[0][:60]!r}: "
                                     "want METHOD /path HTTP/1.1")
    if _TARGET.fullmatch(parts[1]) is None:
        raise HttpProtocolError(400, f"request target {parts[1][:60]!r} is not a path")
    version = _version(parts[2])
    return RequestHead(parts[0].decode("ascii"), parts[1].decode("ascii"), version,
                       _fields(lines[1:]))


def parse_response_head(lines: list[bytes]) -> ResponseHead:
    """A response's head from its lines (``HeadCollector.lines``)."""
    if not lines:
        raise HttpProtocolError(400, "no status line")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if len(code) != 3 or not code.isdigit():
        raise HttpProtocolError(400, f"malformed status line {lines[0][:60]!r}")
    return ResponseHead(int(code), reason.decode("latin-1"), _version(version), _fields(lines[1:]))


def body_length(headers: Headers) -> int | None:
    """The body's length ``headers`` declare; None: no ``Content-Length`` (a request then has
    no body; a response's runs to the end of the connection)."""
    if "Transfer-Encoding" in headers:
        raise HttpProtocolError(501, "Transfer-Encoding is not spoken here: send a body with "
                                     "Content-Length")
    declared = headers.get("Content-Length")
    if declared is None:
        return None
    values = {v.strip() for v in declared.split(",")}  # (a repeated field, joined)
    value = values.pop()
    if values or not value.isdigit() or len(value) > 18:
        raise HttpProtocolError(400, f"malformed Content-Length {declared[:40]!r}")
    return int(value)


def _head(first: str, headers: Mapping[str, str]) -> bytes:
    lines = [first]
    for name, value in headers.items():
        if _TEXT_BAD.search(name) or _TEXT_BAD.search(value) or not name:
            raise ValueError(f"header {name!r} holds a control character or is empty")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def format_response(status: int, body: bytes, headers: Mapping[str, str], *, keep_alive: bool,
                    head_only: bool = False) -> bytes:
    """A response: ``headers``, then ``Content-Length`` (the length of ``body`` even when
    ``head_only``, the answer to a HEAD) and ``Connection: close`` unless ``keep_alive``."""
    fields = {**headers, "Content-Length": str(len(body))}
    if not keep_alive:
        fields["Connection"] = "close"
    head = _head(f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}", fields)
    return head if head_only else head + body


def format_request(method: str, target: str, host: str, headers: Mapping[str, str],
                   body: bytes) -> bytes:
    """A request to ``host`` ("host:port"); a body (or a POST's empty one) with its length."""
    if _TOKEN.fullmatch(method.encode()) is None or _TARGET.fullmatch(target.encode()) is None:
        raise ValueError(f"not a request: {method!r} {target!r}")
    fields = {"Host": host, **headers}
    if body or method == "POST":
        fields["Content-Length"] = str(len(body))
    return _head(f"{method} {target} HTTP/1.1", fields) + body
