"""The NameServer's HTTP API through a real server on 127.0.0.1 port 0 and aiohttp's client: every
endpoint and every error, with golden status codes and JSON shapes. Time is a fake clock moved by
the test, so lease expiry by the scan task needs no real waiting. These servers run
``insecure`` (unsigned registrations accepted): the signatures are ``test_registration_auth``'s."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from namesrv.server import BOOT_ID_HEADER, NameServer

REQUEST_TIMEOUT_S = 5.0
POLL_DEADLINE_S = 5.0


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


Scenario = Callable[[aiohttp.ClientSession, str, FakeClock], Awaitable[None]]


def run(scenario: Scenario, lease_s: float = 120.0, scan_interval_s: float = 5.0) -> None:
    async def main() -> None:
        clock = FakeClock()
        server = NameServer("127.0.0.1", 0, lease_s=lease_s, scan_interval_s=scan_interval_s,
                            clock=clock, insecure=True)
        await server.start()
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as http:
                await scenario(http, server.url, clock)
        finally:
            await server.stop()

    asyncio.run(main())


async def call(http: aiohttp.ClientSession, method: str, url: str,
               **kwargs: Any) -> tuple[int, Any]:
    async with http.request(method, url, **kwargs) as resp:
        assert resp.content_type == "application/json", await resp.text()
        return resp.status, await resp.json()


def registration(node: str = "n0", role: str = "leader", term: int = 7, group: str = "a",
                 port: int = 10911, topics: dict[str, Any] | None = None,
                 admin: str | None = None, **extra: Any) -> dict[str, Any]:
    """A node's registration; a leader names itself as its term's leader."""
    return {"group": group, "node_id": node, "client_address": f"127.0.0.1:{port}",
            "admin_address": admin or f"127.0.0.1:{port + 10}", "role": role, "term": term,
            "topics": {"orders": {"read_queues": 4, "write_queues": 4, "perm": 6}}
            if topics is None else topics, **({"leader": node} if role == "leader" else {}),
            **extra}


async def register_group(http: aiohttp.ClientSession, base: str) -> None:
    for i, node in enumerate(("n0", "n1", "n2")):
        status, _ = await call(http, "POST", f"{base}/v1/brokers/register",
                               json=registration(node, "leader" if i == 0 else "follower",
                                                 port=10911 + i, leader="n0"))
        assert status == 200


# -- endpoints ---------------------------------------------------------------------------------

def test_register_route_topics_and_cluster() -> None:
    async def scenario(http: aiohttp.ClientSession, base: str, clock: FakeClock) -> None:
        status, body = await call(http, "POST", f"{base}/v1/brokers/register",
                                  json=registration("n0"))
        assert (status, body) == (200, {"ok": True, "expires_in_s": 120.0, "group": "a",
                                        "leader": "n0", "term": 7, "stale": False,
                                        "pending": False})
        await register_group(http, base)
        clock.now_s += 1.5
        status, body = await call(http, "GET", f"{base}/v1/topics/orders/route")
        assert status == 200
        assert body == {"topic": "orders", "groups": [{
            "group": "a", "leader": "n0", "term": 7,
            "nodes": [{"node_id": f"n{i}", "client_address": f"127.0.0.1:{10911 + i}",
                       "role": "leader" if i == 0 else "follower", "term": 7,
                       "last_seen_s_ago": 1.5} for i in range(3)],
            "read_queues": 4, "write_queues": 4, "perm": 6}]}
        assert await call(http, "GET", f"{base}/v1/topics") == (200, {"topics": ["orders"]})
        status, body = await call(http, "GET", f"{base}/v1/cluster")
        assert status == 200 and [g["group"] for g in body["groups"]] == ["a"]
        [group] = body["groups"]
        assert (group["leader"], group["term"]) == ("n0", 7)
        assert group["topics"] == {"orders": {"read_queues": 4, "write_queues": 4, "perm": 6}}
        assert group["nodes"][2] == {"node_id": "n2", "client_address": "127.0.0.1:10913",
                                     "admin_address": "127.0.0.1:10923", "role": "follower",
                                     "term": 7, "last_seen_s_ago": 1.5}

    run(scenario)


def test_a_stale_leader_claim_is_accepted_for_liveness_but_reported_and_not_routed() -> None:
    async def scenario(http: aiohttp.ClientSession, base: str, clock: FakeClock) -> None:
        await call(http, "POST", f"{base}/v1/brokers/register", json=registration("n1", term=8))
        status, body = await call(http, "POST", f"{base}/v1/brokers/register",
                                  json=registration("n0", term=7))
        assert (status, body) == (200, {"ok": True, "expires_in_s": 120.0, "group": "a",
                                        "leader": "n1", "term": 8, "stale": True,
                                        "pending": False})
        _, route = await call(http, "GET", f"{base}/v1/topics/orders/route")
        assert route["groups"][0]["leader"] == "n1"

    run(scenario)


def test_several_groups_serve_one_topic_and_empty_views_are_empty() -> None:
    async def scenario(http: aiohttp.ClientSession, base: str, clock: FakeClock) -> None:
        assert await call(http, "GET", f"{base}/v1/topics") == (200, {"topics": []})
        assert await call(http, "GET", f"{base}/v1/cluster") == (200, {"groups": []})
        for group in ("b", "a"):
            await call(http, "POST", f"{base}/v1/brokers/register",
                       json=registration(group=group))
        _, route = await call(http, "GET", f"{base}/v1/topics/orders/route")
        assert [g["group"] for g in route["groups"]] == ["a", "b"]

    run(scenario)


def test_unregister_removes_the_node_and_is_idempotent() -> None:
    async def scenario(http: aiohttp.ClientSession, base: str, clock: FakeClock) -> None:
        await register_group(http, base)
        url = f"{base}/v1/brokers/unregister"
        who = {"group": "a", "node_id": "n0", "term": 7}
        assert await call(http, "POST", url, json=who) == (200, {"ok": True, "removed": True})
        assert await call(http, "POST", url, json=who) == (200, {"ok": True, "removed": False})
        _, route = await call(http, "GET", f"{base}/v1/topics/orders/route")
        assert route["groups"][0]["leader"] is None
        assert [n["node_id"] for n in route["groups"][0]["nodes"]] == ["n1", "n2"]

    run(scenario)


def test_reads_never_show_a_registration_past_its_lease() -> None:
    async def scenario(http: aiohttp.ClientSession, base: str, clock: FakeClock) -> None:
        await register_group(http, base)
        clock.now_s += 5.0
        await call(http, "POST", f"{base}/v1/brokers/register", json=registration("n1", "follower",
                                                                                   port=10912))
        clock.now_s += 6.0  # n0 and n2 are 11 s old, n1 6 s: only n1 is within the 10 s lease
        _, route = await call(http, "GET", f"{base}/v1/topics/orders/route")
        [group] = route["groups"]
        assert [n["node_id"] for n in group["nodes"]] == ["n1"] and group["leader"] is None
        clock.now_s += 20.0
        status, body = await call(http, "GET", f"{base}/v1/topics/orders/route")
        assert (status, body) == (404, {"error": "topic not found", "topic": "orders"})
        assert await call(http, "GET", f"{base}/v1/cluster") == (200, {"groups": []})

    run(scenario, lease_s=10.0)  # the default 5 s scan never runs: reads expire lazily


def test_registrations_leader_changes_and_expiries_are_logged_once_and_refreshes_never(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(http: aiohttp.ClientSession, base: str, clock: FakeClock) -> None:
        await register_group(http, base)
        for _ in range(3):  # the lease's refreshes: the steady state writes nothing
            await register_group(http, base)
        for node in ("n1", "n2"):  # n1 won term 8; n2 follows it
            await call(http, "POST", f"{base}/v1/brokers/register", json=registration(
                node, "leader" if node == "n1" else "follower", term=8, leader="n1",
                port=10911 + int(node[1])))
        await call(http, "POST", f"{base}/v1/brokers/unregister",
                   json={"group": "a", "node_id": "n2", "term": 8})
        clock.now_s += 11.0
        await call(http, "GET", f"{base}/v1/cluster")  # (a read expires the lapsed leases)

    with caplog.at_level(logging.INFO, logger="namesrv.server"):
        run(scenario, lease_s=10.0)
    said = [r.getMessage() for r in caplog.records
            if r.name == "namesrv.server" and r.levelno == logging.INFO]
    assert said == [
        "registered: group a node n0 (leader at term 7; client 127.0.0.1:10911, admin "
        "127.0.0.1:10921)",
        "group a: leader is n0 at term 7 (was none)",
        "registered: group a node n1 (follower at term 7; client 127.0.0.1:10912, admin "
        "127.0.0.1:10922)",
        "registered: group a node n2 (follower at term 7; client 127.0.0.1:10913, admin "
        "127.0.0.1:10923)",
        "group a: leader is n1 at term 8 (was n0 at term 7)",
        "unregistered: group a node n2 (it stopped, at term 8)",
        "lease expired: group a node n0 (not refreshed within 10 s)",
        "lease expired: group a node n1 (not refreshed within 10 s)",
    ], said


def test_the_scan_task_expires_registrations_without_any_read() -> None:
    async def main() -> None:
        clock = FakeClock()
        server = NameServer("127.0.0.1", 0, lease_s=10.0, scan_interval_s=0.01, clock=clock,
                            insecure=True)
        await server.start()
        try:
            async with aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as http:
                await register_group(http, server.url)
            assert server.registry.live_group_count() == 1
            clock.now_s += 10.5
            deadline = asyncio.get_running_loop().time() + POLL_DEADLINE_S
            while server.registry.live_group_count() and \
                    asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
            assert server.registry.live_group_count() == 0
            assert server.registry.leader_of("a") == (None, 0)  # the fence went with the lease
        finally:
            await server.stop()

    asyncio.run(main())


def test_livez_and_readyz() -> None:
    async def scenario(http: aiohttp.ClientSession, base: str, clock: FakeClock) -> None:
        assert await call(http, "GET", f"{base}/livez") == (200, {"ok": True})
        assert await call(http, "GET", f"{base}/readyz") == (200, {"ready": True, "groups": 0,
                                                             "registrations": "insecure"})

    run(scenario)


def test_every_response_names_the_servers_boot_id_and_a_restart_changes_it() -> None:
    async def boot_ids() -> list[str]:
        seen = []
        async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as http:
            for _ in range(2):  # two servers: a restart draws a new id
                server = NameServer("127.0.0.1", 0, insecure=True)
                await server.start()
                try:
                    for path in ("/livez", "/v1/topics/nope/route", "/v1/nothing"):
                        async with http.get(server.url + path) as resp:
                            seen.append(resp.headers[BOOT_ID_HEADER])
                finally:
                    await server.stop()
        return seen

    ids = asyncio.run(boot_ids())
    assert len(set(ids[:3])) == 1 and len(set(ids[3:])) == 1 and ids[0] != ids[3]
    assert len(ids[0]) == 32


# -- routing integrity: terms the group does not report, unregisters of another registration --

class StatusServers:
    """Stand-ins for the group's admin endpoints: ``GET /status`` answers what ``terms`` says."""

    def __init__(self, group: str, nodes: tuple[str, ...]) -> None:
        self.group = group
        self.terms = {n: 7 for n in nodes}
        self.addresses: dict[str, str] = {}
        self._runners: list[web.AppRunner] = []

    async def start(self) -> StatusServers:
        for node in self.terms:
            app = web.Application()
            app.router.add_get("/status", self._status(node))
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            host, port = runner.addresses[0][:2]
            self.addresses[node] = f"{host}:{port}"
            self._runners.append(runner)
        return self

    def _status(self, node: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def status(_: web.Request) -> web.Response:
            return web.json_response({"group": self.group,
                                      "raft": {"node_id": node, "term": self.terms[node]}})
        return status

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()


def closed_port_address() -> str:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_claim_at_a_term_the_group_does_not_report_is_refused_and_wedges_nothing() -> None:
    async def scenario(http: aiohttp.ClientSession, base: str, clock: FakeClock) -> None:
        admins = await StatusServers("a", ("n0", "n1", "n2")).start()
        register = f"{base}/v1/brokers/register"
        try:
            for i, node in enumerate(("n0", "n1", "n2")):
                status, _ = await call(http, "POST", register, json=registration(
                    node, "leader" if i == 0 else "follower", port=10911 + i,
                    admin=admins.addresses[node], instance=f"i{i}"))
                assert status == 200
            for body in (registration("evil", term=2**62, admin=admins.addresses["n0"]),
                         registration("evil", term=2**62, admin=closed_port_address()),
                         registration("n0", term=2**62, admin=admins.addresses["n0"]),
                         registration("evil", "follower", term=2**62,
                                      admin=admins.addresses["n1"])):
                status, answer = await call(http, "POST", register, json=body)
                assert status == 409, (body, answer)
                assert "beyond what the group reports (term 7" in answer["error"]
            _, route = await call(http, "GET", f"{base}/v1/topics/orders/route")
            group = route["groups"][0]
            assert (group["leader"], group["term"]) == ("n0", 7)
            assert "evil" not in [n["node_id"] for n in group["nodes"]]
            # a real jump (a NameServer that missed many elections) is confirmed by the group
            admins.terms.update(n0=40, n1=40, n2=40)
            status, answer = await call(http, "POST", register, json=registration(
                "n1", term=40, port=10912, admin=admins.addresses["n1"], instance="i1"))
            assert (status, answer["leader"], answer["stale"], answer["pending"]) == (
                200, "n0", False, True)  # the term checks; the leadership waits for a member
            status, answer = await call(http, "POST", register, json=registration(
                "n2", "follower", term=40, port=10913, admin=admins.addresses["n2"],
                leader="n1"))
            assert (status, answer["leader"], answer["term"]) == (200, "n1", 40)
            # an unregister must name the registration: term and instance
            unregister = f"{base}/v1/brokers/unregister"
            for who in ({"group": "a", "node_id": "n1", "term": 7, "instance": "i1"},
                        {"group": "a", "node_id": "n1", "term": 40},
                        {"group": "a", "node_id": "n1", "term": 40, "instance": "i9"}):
                status, answer = await call(http, "POST", unregister, json=who)
                assert status == 409 and "not removed" in answer["error"], (who, answer)
            _, route = await call(http, "GET", f"{base}/v1/topics/orders/route")
            assert route["groups"][0]["leader"] == "n1"
            assert await call(http, "POST", unregister, json={
                "group": "a", "node_id": "n1", "term": 40, "instance": "i1"}) == (
                    200, {"ok": True, "removed": True})
        finally:
            await admins.stop()

    run(scenario)


def test_a_claim_at_an_absurd_term_no_longer_fences_the_group_once_its_lease_expired() -> None:
    async def scenario(http: aiohttp.ClientSession, base: str, clock: FakeClock) -> None:
        register = f"{base}/v1/brokers/register"
        # into a group with no live node (a NameServer just restarted) nothing can be checked
        status, _ = await call(http, "POST", register, json=registration("evil", term=2**62))
        assert status == 200
        for _ in range(3):  # the real group registers every 4 s: fenced while evil's claim lives
            await register_group(http, base)
            _, route = await call(http, "GET", f"{base}/v1/topics/orders/route")
            assert route["groups"][0]["leader"] == "evil"
            clock.now_s += 4.0
        await register_group(http, base)  # evil's claim expired (12 s old, lease 10 s)
        _, route = await call(http, "GET", f"{base}/v1/topics/orders/route")
        assert (route["groups"][0]["leader"], route["groups"][0]["term"]) == ("n0", 7)

    run(scenario, lease_s=10.0)
