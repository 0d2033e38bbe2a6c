"""``protocol.http1``: heads collected within their bounds, requests and responses parsed, bad
input refused with the status a server answers, and what this side writes."""

from __future__ import annotations

import pytest

from protocol.http1 import (
    HEAD_BYTES_MAX,
    HEADERS_MAX,
    HeadCollector,
    Headers,
    HttpProtocolError,
    body_length,
    format_request,
    format_response,
    parse_request_head,
    parse_response_head,
)


def collect(raw: bytes) -> list[bytes]:
    """The lines of the head at the start of ``raw`` (as a shell feeds them, one at a time)."""
    collector = HeadCollector()
    for line in raw.splitlines(keepends=True):
        if collector.add(line):
            return collector.lines
    raise AssertionError("the head did not end")


def refused(raw: bytes) -> int:
    with pytest.raises(HttpProtocolError) as err:
        parse_request_head(collect(raw))
    return err.value.status


def test_a_request_head_parses_with_its_fields_by_any_case() -> None:
    head = parse_request_head(collect(
        b"\r\nGET /status?x=1 HTTP/1.1\r\nHost: n0\r\nX-DLedger-Node: g/n0\r\n"
        b"Accept: a\r\naccept:  b \r\n\r\nignored body"))
    assert (head.method, head.target, head.path, head.version) == ("GET", "/status?x=1",
                                                                   "/status", (1, 1))
    assert head.headers["x-dledger-node"] == "g/n0" and head.headers.get("HOST") == "n0"
    assert head.headers["Accept"] == "a, b"  # a repeated field, joined
    assert head.keep_alive and body_length(head.headers) is None
    assert not parse_request_head(collect(b"GET / HTTP/1.1\nConnection: Close\n\n")).keep_alive
    assert not parse_request_head(collect(b"GET / HTTP/1.0\r\n\r\n")).keep_alive
    assert parse_request_head(collect(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
                              ).keep_alive


def test_malformed_heads_are_400_and_other_versions_505() -> None:
    for raw in (b"GET /\r\n\r\n", b"GET  / HTTP/1.1\r\n\r\n", b"GET status HTTP/1.1\r\n\r\n",
                b"G(T / HTTP/1.1\r\n\r\n", b"GET / HTTP/one\r\n\r\n",
                b"GET / HTTP/1.1\r\nHost n0\r\n\r\n", b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
                b"GET / HTTP/1.1\r\nA: 1\r\n folded\r\n\r\n", b"GET / HTTP/1.1\r\nA: \x01\r\n\r\n",
                b"GET /\xff HTTP/1.1\r\n\r\n"):
        assert refused(raw) == 400, raw
    assert refused(b"GET / HTTP/2.0\r\n\r\n") == 505
    with pytest.raises(HttpProtocolError) as err:
        collect(b"\r\n" * 10 + b"GET / HTTP/1.1\r\n\r\n")
    assert err.value.status == 400


def test_bodies_by_content_length_only() -> None:
    def length(*fields: str) -> int | None:
        return body_length(Headers((f.split(": ")[0], f.split(": ")[1]) for f in fields))

    assert length("Content-Length: 12") == 12
    assert length("Content-Length: 5", "content-length: 5") == 5
    for bad in (("Content-Length: -1",), ("Content-Length: 1x",), ("Content-Length: ",),
                ("Content-Length: 5", "Content-Length: 6"), ("Content-Length: " + "9" * 19,)):
        with pytest.raises(HttpProtocolError) as err:
            length(*bad)
        assert err.value.status == 400, bad
    with pytest.raises(HttpProtocolError) as err:
        length("Transfer-Encoding: chunked")
    assert err.value.status == 501 and "Content-Length" in str(err.value)


def test_heads_past_their_bounds_are_414_or_431() -> None:
    assert HeadCollector().line_too_long().status == 414  # the request line
    started = HeadCollector()
    started.add(b"GET / HTTP/1.1\r\n")
    assert started.line_too_long().status == 431  # a header line
    many = b"GET / HTTP/1.1\r\n" + b"A: 1\r\n" * (HEADERS_MAX + 1) + b"\r\n"
    large = b"GET / HTTP/1.1\r\n" + (b"A: " + b"x" * 4000 + b"\r\n") * (HEAD_BYTES_MAX // 4000 + 1)
    for raw in (many, large):
        with pytest.raises(HttpProtocolError) as err:
            collect(raw)
        assert err.value.status == 431
    assert len(collect(b"GET / HTTP/1.1\r\n" + b"A: 1\r\n" * HEADERS_MAX + b"\r\n")) == HEADERS_MAX + 1


def test_a_response_head_parses_and_this_side_writes_both_ways() -> None:
    head = parse_response_head(collect(b"HTTP/1.1 503 Service Unavailable\r\n"
                                       b"Content-Length: 2\r\nX-NameServer-Boot-Id: b1\r\n\r\n"))
    assert (head.status, head.reason, head.keep_alive) == (503, "Service Unavailable", True)
    assert head.headers["x-nameserver-boot-id"] == "b1" and body_length(head.headers) == 2
    assert parse_response_head(collect(b"HTTP/1.1 200\r\n\r\n")).reason == ""
    for bad in (b"HTTP/1.1 2000 OK\r\n\r\n", b"HTTP/1.1 OK\r\n\r\n", b"ICY 200 OK\r\n\r\n"):
        with pytest.raises(HttpProtocolError):
            parse_response_head(collect(bad))

    raw = format_response(404, b'{"e":1}', {"Content-Type": "application/json"}, keep_alive=False)
    assert raw == (b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
                   b"Content-Length: 7\r\nConnection: close\r\n\r\n{\"e\":1}")
    assert format_response(200, b"abc", {}, keep_alive=True, head_only=True) == \
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n"
    request = format_request("POST", "/v1/brokers/register", "127.0.0.1:9876",
                             {"Content-Type": "application/json"}, b"{}")
    assert request == (b"POST /v1/brokers/register HTTP/1.1\r\nHost: 127.0.0.1:9876\r\n"
                       b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
    again = parse_request_head(collect(request))
    assert again.method == "POST" and body_length(again.headers) == 2
    assert b"Content-Length" not in format_request("GET", "/livez", "h:1", {}, b"")
    for bad_request in (("GET", "livez", {}), ("G T", "/", {}), ("GET", "/", {"A": "1\r\nB: 2"})):
        with pytest.raises(ValueError):
            format_request(bad_request[0], bad_request[1], "h:1", bad_request[2], b"")  # type: ignore[arg-type]
