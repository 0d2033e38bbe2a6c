"""The NameServer's HTTP API refusing what it must (``test_namesrv_http``'s servers and helpers):
every malformed registration a 400 naming the problem, deep JSON, a body over 1 MiB, unknown
paths and methods, a bad topic name, and the server's own misuse by name."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from namesrv.errors import ServerStateError
from namesrv.server import BODY_BYTES_MAX, NameServer
from tests.namesrv.test_namesrv_http import FakeClock, call, registration, run

# -- errors ------------------------------------------------------------------------------------

def _without(key: str) -> dict[str, Any]:
    body = registration()
    del body[key]
    return body


def _with(**changes: Any) -> dict[str, Any]:
    return {**registration(), **changes}


BAD_REGISTRATIONS = [
    (_without("group"), "missing field group"),
    (_without("node_id"), "missing field node_id"),
    (_without("client_address"), "missing field client_address"),
    (_without("admin_address"), "missing field admin_address"),
    (_without("role"), "missing field role"),
    (_without("term"), "missing field term"),
    (_with(term=-1), "term must be an integer"),
    (_with(term="7"), "term must be an integer"),
    (_with(term=True), "term must be an integer"),
    (_with(term=2**63), "term must be an integer"),
    (_with(role="king"), "role must be one of"),
    (_with(group=""), "group must be"),
    (_with(group=5), "group must be"),
    (_with(node_id="a b"), "node_id must be"),
    (_with(client_address="localhost"), "client_address 'localhost' is not \"host:port\""),
    (_with(client_address="h:0"), "client_address 'h:0': port out of range"),
    (_with(client_address="h:70000"), "port out of range"),
    (_with(client_address="h:x"), "has no numeric port"),
    (_with(client_address="::1:80"), "IPv6 host in brackets"),
    (_with(admin_address=10921), "admin_address must be a \"host:port\" string"),
    (_with(client_address="0.0.0.0:10911"), "names every interface"),
    (_with(admin_address="[::]:8080"), "admin_address '[::]:8080' names every interface"),
    (_with(grpc_address="0.0.0.0:8081"), "grpc_address '0.0.0.0:8081' names every interface"),
    (_with(topics=[]), "topics must be a JSON object"),
    (_with(topics={"bad name": {"read_queues": 4, "write_queues": 4, "perm": 6}}),
     "bad topic name"),
    (_with(topics={"t": {"write_queues": 4, "perm": 6}}), "missing field topics['t'].read_queues"),
    (_with(topics={"t": {"read_queues": 4, "write_queues": -1, "perm": 6}}),
     "topics['t'].write_queues must be an integer 0..1024"),
    (_with(topics={"t": {"read_queues": 4, "write_queues": 4, "perm": 5}}),
     "topics['t'].perm must be 2 (write), 4 (read) or 6 (both)"),
    (_with(topics={"t": 4}), "topics['t'] must be a JSON object"),
    (_with(auto_create_queues=-1), "auto_create_queues must be an integer 0..1024"),
    (_with(auto_create_queues=1025), "auto_create_queues must be an integer 0..1024"),
    (_with(auto_create_queues="4"), "auto_create_queues must be an integer 0..1024"),
    (_with(auto_create_queues=True), "auto_create_queues must be an integer 0..1024"),
    ([1, 2], "the body must be a JSON object, not list"),
]


def test_every_bad_registration_gets_400_naming_the_problem() -> None:
    async def scenario(http: aiohttp.ClientSession, base: str, clock: FakeClock) -> None:
        for body, needle in BAD_REGISTRATIONS:
            status, answer = await call(http, "POST", f"{base}/v1/brokers/register", json=body)
            assert status == 400 and list(answer) == ["error"], (body, answer)
            assert needle in answer["error"], (body, answer)
        status, answer = await call(http, "POST", f"{base}/v1/brokers/register", data=b"{nope")
        assert status == 400 and answer["error"].startswith("the body is not valid JSON")
        status, answer = await call(http, "POST", f"{base}/v1/brokers/unregister",
                                    json={"group": "a"})
        assert (status, answer) == (400, {"error": "missing field node_id"})
        status, answer = await call(http, "POST", f"{base}/v1/brokers/unregister",
                                    json={"group": "a", "node_id": "n0"})
        assert (status, answer) == (400, {"error": "missing field term"})
        assert (await call(http, "GET", f"{base}/v1/cluster"))[1] == {"groups": []}

    run(scenario)


def test_deeply_nested_json_is_a_400_like_any_other_malformed_body() -> None:
    async def scenario(http: aiohttp.ClientSession, base: str, clock: FakeClock) -> None:
        depth = 100_000  # 200 KB: well within the body bound, far past the decoder's recursion
        for path in ("register", "unregister"):
            for body in (b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth):
                status, answer = await call(http, "POST", f"{base}/v1/brokers/{path}", data=body,
                                            headers={"Content-Type": "application/json"})
                assert (status, answer) == (
                    400, {"error": "the body is not valid JSON: nested too deeply"})
        assert await call(http, "GET", f"{base}/livez") == (200, {"ok": True})

    run(scenario)


def test_an_ipv6_address_in_brackets_is_accepted() -> None:
    async def scenario(http: aiohttp.ClientSession, base: str, clock: FakeClock) -> None:
        status, _ = await call(http, "POST", f"{base}/v1/brokers/register",
                               json=_with(client_address="[::1]:10911"))
        assert status == 200

    run(scenario)


def test_unknown_topic_unknown_path_wrong_method_and_bad_topic_name() -> None:
    async def scenario(http: aiohttp.ClientSession, base: str, clock: FakeClock) -> None:
        assert await call(http, "GET", f"{base}/v1/topics/nope/route") == (
            404, {"error": "topic not found", "topic": "nope"})
        assert await call(http, "GET", f"{base}/v1/nothing") == (
            404, {"error": "not found", "path": "/v1/nothing"})
        assert await call(http, "GET", f"{base}/v1/brokers/register") == (
            405, {"error": "method not allowed"})
        status, body = await call(http, "GET", f"{base}/v1/topics/a%20b/route")
        assert status == 400 and body["error"].startswith("bad topic name")

    run(scenario)


def test_a_body_over_one_mib_is_refused_with_413() -> None:
    async def scenario(http: aiohttp.ClientSession, base: str, clock: FakeClock) -> None:
        body = b'{"pad": "' + b"x" * BODY_BYTES_MAX + b'"}'
        status, answer = await call(http, "POST", f"{base}/v1/brokers/register", data=body,
                                    headers={"Content-Type": "application/json"})
        assert status == 413
        assert answer == {"error": "request entity too large", "body_bytes_max": BODY_BYTES_MAX}

    run(scenario)


def test_start_twice_and_address_before_start_are_named_errors() -> None:
    async def main() -> None:
        server = NameServer("127.0.0.1", 0)
        with pytest.raises(ServerStateError):
            _ = server.address
        await server.start()
        try:
            with pytest.raises(ServerStateError):
                await server.start()
        finally:
            await server.stop()
            await server.stop()

    asyncio.run(main())
