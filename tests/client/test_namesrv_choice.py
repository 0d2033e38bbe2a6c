"""Which NameServer a client asks (issue 34 item 12): RocketMQ's client draws a random one first,
keeps it while it answers, and when it does not goes on to the next in the list (round robin);
ours always asked the first one first, so every client of a cluster loaded the same NameServer.

Three in-process NameServers on 127.0.0.1 port 0, each with another broker group registered
(``a``, ``b``, ``c``), so that the group a client sees names the NameServer that answered."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from client.cluster import routes as routes_module
from client.cluster.routes import Routes
from namesrv.server import NameServer
from tests.namesrv.test_namesrv_http import registration


async def answered_by(routes: Routes) -> str:
    groups = await routes.cluster_groups()
    return groups[0].group


async def three_namesrvs() -> list[NameServer]:
    servers = [NameServer("127.0.0.1", 0, insecure=True) for _ in range(3)]
    async with aiohttp.ClientSession() as http:
        for ns, group in zip(servers, "abc"):
            await ns.start()
            async with http.post(f"{ns.url}/v1/brokers/register",
                                 json=registration(group=group)) as resp:
                assert resp.status == 200
    return servers


def addresses(servers: list[NameServer]) -> list[str]:
    return [ns.url.removeprefix("http://") for ns in servers]


def test_clients_spread_over_the_namesrvs() -> None:
    """Twelve clients given the same three addresses do not all ask the first (all on one by
    chance: 1 in 177,147)."""
    async def body() -> None:
        servers = await three_namesrvs()
        try:
            firsts = set()
            for _ in range(12):
                routes = Routes(addresses(servers))
                await routes.start()
                firsts.add(await answered_by(routes))
                await routes.close()
            assert len(firsts) > 1, firsts
        finally:
            for ns in servers:
                await ns.stop()

    asyncio.run(body())


def test_a_client_keeps_the_namesrv_it_drew_then_goes_round_robin(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes_module, "first_namesrv", lambda count: 1, raising=False)

    async def body() -> None:
        servers = await three_namesrvs()
        routes = Routes(addresses(servers))
        try:
            await routes.start()
            assert [await answered_by(routes) for _ in range(3)] == ["b", "b", "b"]  # kept
            await servers[1].stop()  # the one in use goes away: the next in the list
            assert [await answered_by(routes) for _ in range(2)] == ["c", "c"]
            await servers[2].stop()  # and that one too: round robin to the first
            assert await answered_by(routes) == "a"
        finally:
            await routes.close()
            for ns in servers:
                await ns.stop()

    asyncio.run(body())
    assert len({routes_module._random_namesrv(3) for _ in range(64)}) == 3  # production's draw
