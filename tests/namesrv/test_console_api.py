"""The web console's endpoints without a browser and without brokers: the page and its files load
with nothing from outside the cluster, a registered node that does not answer is shown as
unreachable (with the error) in the snapshot and in the live event stream, every action's
fields are checked (named errors, 4xx), read-only mode refuses actions, the live poll stops when
the last browser leaves, and the server stops with a browser still subscribed.

The same endpoints against a real cluster: ``test_console_cluster.py``; in a browser:
``test_console_browser.py``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from namesrv.console import ACTION_BODY_BYTES_MAX, STATIC_DIR, console_of
from namesrv.console_model import RateTracker, parse_search
from namesrv.errors import BadRequestError
from namesrv.registration_auth import RegistrationGuard
from namesrv.registry import Registry
from namesrv.server import NameServer, make_app
from tests.nodes.test_processes import wait_until

TIMEOUT = aiohttp.ClientTimeout(total=20)


@contextlib.asynccontextmanager
async def served(read_only: bool = False) -> AsyncIterator[tuple[str, web.Application]]:
    """The NameServer's app on 127.0.0.1, port 0; (base URL, app)."""
    app = make_app(Registry(), console_read_only=read_only,
                   guard=RegistrationGuard(None, insecure=True))  # (unsigned registrations)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}", app
    finally:
        await asyncio.wait_for(runner.cleanup(), 15)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, read back, closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def register_silent_node(session: aiohttp.ClientSession, base: str) -> None:
    addr = f"127.0.0.1:{closed_port()}"
    reg = {"group": "g1", "node_id": "n0", "client_address": addr, "admin_address": addr,
           "role": "leader", "term": 7, "topics": {"orders": {"read_queues": 2,
                                                              "write_queues": 2, "perm": 6}}}
    async with session.post(base + "/v1/brokers/register", json=reg) as resp:
        assert resp.status == 200, await resp.text()


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url) as resp:
        return resp.status, await resp.json()


async def post(session: aiohttp.ClientSession, url: str, body: Any = None, raw: bytes | None = None,
               content_type: str = "application/json") -> tuple[int, Any]:
    data = raw if raw is not None else json.dumps(body).encode()
    async with session.post(url, data=data, headers={"Content-Type": content_type}) as resp:
        return resp.status, await resp.json()


def test_the_page_and_its_files_load_from_the_namesrv_alone() -> None:
    async def main() -> None:
        async with served() as (base, _), aiohttp.ClientSession(timeout=TIMEOUT) as s:
            async with s.get(base + "/console") as resp:
                page = await resp.text()
                assert resp.status == 200 and resp.content_type == "text/html"
            assert 'data-read-only="false"' in page
            assets = re.findall(r'(?:src|href)="([^"#]+)"', page)
            assert sorted(assets) == ["/console/static/console.css", "/console/static/console.js",
                                      "/console/static/favicon.svg"]
            for path in [*assets, "/favicon.ico"]:  # (a browser asks for the last by itself)
                async with s.get(base + path) as resp:
                    assert resp.status == 200, path
            assert await get(s, base + "/console/api/config") == (
                200, {"read_only": False, "poll_interval_ms": 500})
    asyncio.run(main())
    for f in STATIC_DIR.iterdir():  # no CDN, no font service: nothing outside the cluster
        text = f.read_text().replace('xmlns="http://www.w3.org/2000/svg"', "")  # (a name)
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text), f.name


def test_a_node_that_does_not_answer_is_shown_unreachable_with_the_error() -> None:
    async def main() -> None:
        async with served() as (base, _), aiohttp.ClientSession(timeout=TIMEOUT) as s:
            await register_silent_node(s, base)
            status, snap = await get(s, base + "/console/api/snapshot")
            assert status == 200
            assert set(snap) >= {"seq", "at_ms", "took_ms", "interval_ms", "groups",
                                 "consumer_groups"}
            (group,) = snap["groups"]
            assert group["group"] == "g1" and group["leader"] is None
            assert group["registered_leader"] == "n0"  # the NameServer's view, shown beside
            assert group["health"] == "no quorum"
            (node,) = group["nodes"]
            assert node["node"] == "n0" and node["role"] == "unreachable"
            assert node["error"].startswith("cannot connect")
            assert node["registration"]["role"] == "leader"
            assert node["registration"]["term"] == 7
    asyncio.run(main())


async def next_event(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    """The next ``snapshot`` event of an event stream (comments and other fields skipped)."""
    while True:
        block = (await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 10)).decode()
        fields = dict(line.split(": ", 1) for line in block.strip().splitlines()
                      if ": " in line and not line.startswith(":"))
        if fields.get("event") == "snapshot":
            return dict(json.loads(fields["data"]))


def test_the_event_stream_pushes_snapshots_and_the_poll_stops_when_the_browser_leaves() -> None:
    async def main() -> None:
        async with served() as (base, app), aiohttp.ClientSession(timeout=TIMEOUT) as s:
            await register_silent_node(s, base)
            poller = console_of(app).poller
            async with s.get(base + "/console/events") as resp:
                assert resp.headers["Content-Type"] == "text/event-stream"
                first = await next_event(resp)
                second = await next_event(resp)
                assert second["seq"] > first["seq"]
                assert second["groups"][0]["nodes"][0]["role"] == "unreachable"
                assert poller.subscribers == 1 and poller.running
            await wait_until(lambda: poller.subscribers == 0 and not poller.running, 10,
                             "the poll to stop once no browser watches")
    asyncio.run(main())


def test_the_namesrv_stops_with_a_browser_still_watching() -> None:
    async def main() -> None:
        ns = NameServer(port=0, insecure=True)  # (registrations of this test unsigned)
        host, port = await ns.start()
        async with aiohttp.ClientSession(timeout=TIMEOUT) as s, \
                s.get(f"http://{host}:{port}/console/events") as resp:
            await next_event(resp)
            await asyncio.wait_for(ns.stop(), 20)
            # the feed was ended by the server (a complete response), not cut off when
            # the runner's handler timeout ran out
            await asyncio.wait_for(resp.content.read(), 10)
            assert resp.content.at_eof()
    asyncio.run(main())


@pytest.mark.parametrize("path, body, says", [
    ("topics", {}, "missing field(s) mode, name"),
    ("topics", [], "must be a JSON object"),
    ("topics", {"mode": "create", "name": "t", "queues": 0}, "queues must be an integer 1..1024"),
    ("topics", {"mode": "create", "name": "t"}, "missing field queues"),
    ("topics", {"mode": "create", "name": "t", "queues": 4, "perm": 5}, "perm must be 2"),
    ("topics", {"mode": "create", "name": "t", "queues": True}, "queues must be an integer"),
    ("topics", {"mode": "create", "name": "bad name", "queues": 4}, "name: topic name"),
    ("topics", {"mode": "create", "name": "%RETRY%g", "queues": 4}, "reserved system topic"),
    ("topics", {"mode": "update", "name": "t"}, "nothing to change"),
    ("topics", {"mode": "drop", "name": "t"}, "mode must be"),
    ("topics", {"mode": "create", "name": "t", "queues": 4, "colour": 1}, "unknown field(s) colour"),
    ("topics", {"mode": "create", "name": "t", "queues": 4, "groups": ["a b"]}, "groups[]"),
    ("leader-transfer", {"group": "a"}, "missing field(s) to"),
    ("leader-transfer", {"group": "a", "to": "n/1"}, "to must be 1..64"),
    ("reset-offset", {"consumer_group": "g", "topic": "t", "to": "timestamp"},
     "missing field(s) timestamp_ms"),
    ("reset-offset", {"consumer_group": "g", "topic": "t", "to": "latest", "timestamp_ms": 5},
     "timestamp_ms goes with"),
    ("reset-offset", {"consumer_group": "g", "topic": "t", "to": "earliest", "force": "yes"},
     "force must be true or false"),
    ("reset-offset", {"consumer_group": "g g", "topic": "t", "to": "earliest"},
     "consumer_group must be"),
    ("consume-directly", {"consumer_group": "g", "client_id": "c"},
     "missing field(s) offset_msg_id"),
    ("consume-directly", {"consumer_group": "g", "client_id": "c\n", "offset_msg_id": "x"},
     "client_id must be"),
    ("consume-directly", {"consumer_group": "g", "client_id": "c", "offset_msg_id": "a-1-0"},
     "offset_msg_id is not an offset msg id"),
])
def test_every_action_field_is_checked(path: str, body: Any, says: str) -> None:
    async def main() -> None:
        async with served() as (base, _), aiohttp.ClientSession(timeout=TIMEOUT) as s:
            status, answer = await post(s, f"{base}/console/api/{path}", body)
            assert status == 400, answer
            assert says in answer["error"] and answer["error_type"] == "BadRequestError"
    asyncio.run(main())


def test_action_bodies_are_json_and_bounded() -> None:
    async def main() -> None:
        async with served() as (base, _), aiohttp.ClientSession(timeout=TIMEOUT) as s:
            url = base + "/console/api/topics"
            status, answer = await post(s, url, raw=b"{not json")
            assert status == 400 and "not valid JSON" in answer["error"]
            status, answer = await post(s, url, raw=b"mode=create", content_type="text/plain")
            assert status == 400 and "must be application/json" in answer["error"]
            big = json.dumps({"mode": "create", "name": "t", "pad": "x" * ACTION_BODY_BYTES_MAX})
            status, answer = await post(s, url, raw=big.encode())
            assert status == 413 and answer["error_type"] == "BodyTooLargeError"
    asyncio.run(main())


def test_an_action_on_a_cluster_without_groups_is_a_named_404() -> None:
    async def main() -> None:
        async with served() as (base, _), aiohttp.ClientSession(timeout=TIMEOUT) as s:
            status, answer = await post(s, base + "/console/api/leader-transfer",
                                        {"group": "a", "to": "n1"})
            assert status == 404, answer
            assert answer["error"] == "no broker group is registered at this NameServer"
    asyncio.run(main())


def test_read_only_mode_refuses_every_action_and_tells_the_page() -> None:
    async def main() -> None:
        async with served(read_only=True) as (base, _), aiohttp.ClientSession(timeout=TIMEOUT) as s:
            async with s.get(base + "/console") as resp:
                assert 'data-read-only="true"' in await resp.text()
            assert (await get(s, base + "/console/api/config"))[1]["read_only"] is True
            for path, body in [("topics", {"mode": "create", "name": "t", "queues": 4}),
                               ("leader-transfer", {"group": "a", "to": "n1"}),
                               ("reset-offset", {"consumer_group": "g", "topic": "t",
                                                 "to": "earliest"}),
                               ("consume-directly", {"consumer_group": "g", "client_id": "c",
                                                     "offset_msg_id": "a-" + "0" * 16 + "-0"}),
                               ("topics", {})]:  # refused before its fields are even read
                status, answer = await post(s, f"{base}/console/api/{path}", body)
                assert status == 403, (path, answer)
                assert answer["error_type"] == "ConsoleReadOnlyError"
                assert "--console-read-only" in answer["error"]
            status, _ = await get(s, base + "/console/api/snapshot")  # reads still work
            assert status == 200
    asyncio.run(main())


@pytest.mark.parametrize("query, says", [
    ({}, "give msg_id"),
    ({"topic": "t"}, "give key, or queue"),
    ({"topic": "t", "queue": "a"}, "queue must be GROUP/QUEUE_ID"),
    ({"topic": "t", "queue": "a/1024"}, "queue must be GROUP/QUEUE_ID"),
    ({"topic": "t", "queue": "a/0", "count": "65"}, "count must be an integer 1..64"),
    ({"topic": "t", "queue": "a/0", "offset": "-1"}, "offset must be an integer"),
    ({"msg_id": "x", "topic": "t"}, "goes alone"),
    ({"unique_key": "u", "key": "k"}, "unique_key goes alone or with topic"),
    ({"color": "x"}, "unknown parameter(s) color"),
])
def test_a_search_names_what_is_wrong_with_it(query: dict[str, str], says: str) -> None:
    with pytest.raises(BadRequestError, match=re.escape(says)):
        parse_search(query)


def test_a_search_by_queue_reads_its_fields() -> None:
    s = parse_search({"topic": "orders", "queue": "b/3", "offset": "17", "count": "5"})
    assert (s.by, s.topic, s.broker_group, s.queue_id, s.offset, s.count) == (
        "offset", "orders", "b", 3, 17, 5)
    s = parse_search({"topic": "orders", "key": "k1", "begin_ms": "10"})
    assert (s.by, s.key, s.begin_ms, s.end_ms) == ("key", "k1", 10, None)


def test_the_rate_is_the_max_offset_difference_over_the_time_between_samples() -> None:
    rates = RateTracker(keys_max=2)
    assert rates.sample("q", 100, now_s=10.0) is None  # the first sample has no rate
    assert rates.sample("q", 150, now_s=12.0) == 25.0
    assert rates.sample("q", 999, now_s=12.1) == 25.0  # too close: the last rate again
    assert rates.sample("q", 150, now_s=14.0) == 0.0
    assert rates.sample("q", 10, now_s=16.0) is None  # the queue went back (recreated)
    rates.sample("r", 0, now_s=16.0)
    rates.sample("s", 0, now_s=16.0)  # a third key: the least recently sampled ("q") goes
    assert rates.sample("q", 20, now_s=18.0) is None


def test_the_namesrv_command_takes_console_read_only() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "namesrv", "--listen", "127.0.0.1:0",
                             "--console-read-only"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        host, port = json.loads(proc.stdout.readline())["listen"]

        async def main() -> None:
            async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
                status, answer = await post(s, f"http://{host}:{port}/console/api/topics",
                                            {"mode": "create", "name": "t", "queues": 4})
                assert status == 403 and answer["error_type"] == "ConsoleReadOnlyError"
        asyncio.run(main())
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
