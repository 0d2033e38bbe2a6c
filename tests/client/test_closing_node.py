"""A producer against a node that reads each request and closes the connection before answering
(issue 34 item 2): it used to dial such a node again at once for the whole send deadline (49,330
connections in under 20 s). Now the group's connection pool suspects the node from its third
such close in a row, tries the group's other members first, and dials it again only after a
growing pause.

Real sockets on 127.0.0.1 port 0: an in-process NameServer routes topic ``t`` to group ``a``,
whose nodes are small servers written here: ``bad`` reads a request and closes (counting the
connections it accepts), ``good`` answers every send as a leader would."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from client import Message, Producer, SendTimeoutError
from namesrv.server import NameServer
from protocol import broker_kinds as bp
from protocol.envelope import decode_request, encode_result
from protocol.framed import FramedProtocol
from tests.client.test_producer_grouping import ok
from tests.namesrv.test_namesrv_http import registration

TOPICS = {"t": {"read_queues": 4, "write_queues": 4, "perm": 6}}


class Node(FramedProtocol):
    """One connection to a fake node: ``closes`` (read a request, close) or answers sends."""

    def __init__(self, accepted: list[int], closes: bool) -> None:
        super().__init__()
        self.accepted, self.closes = accepted, closes

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.accepted[0] += 1
        super().connection_made(transport)

    def payload_received(self, payload: bytes) -> None:
        if self.closes:
            assert self.transport is not None
            self.transport.close()
            return
        req = decode_request(payload, bp.SEND_KINDS)
        assert req.kind == bp.SEND_RUNS
        self.send_payload(encode_result(req.request_id, ok("a", req.args[0])))


async def serve(accepted: list[int], closes: bool) -> tuple[asyncio.Server, int]:
    server = await asyncio.get_running_loop().create_server(
        lambda: Node(accepted, closes), "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@asynccontextmanager
async def cluster(*nodes: tuple[str, bool]) -> AsyncIterator[tuple[str, dict[str, list[int]]]]:
    """A NameServer naming group ``a`` of ``nodes`` ((node id, closes) each, the first its
    leader); yields its address and each node's count of accepted connections."""
    counts = {name: [0] for name, _ in nodes}
    servers = []
    ns = NameServer("127.0.0.1", 0, insecure=True)
    await ns.start()
    try:
        async with aiohttp.ClientSession() as http:
            for i, (name, closes) in enumerate(nodes):
                server, port = await serve(counts[name], closes)
                servers.append(server)
                reg = registration(name, "leader" if i == 0 else "follower", port=port,
                                   topics=TOPICS, **({} if i == 0 else {"leader": nodes[0][0]}))
                async with http.post(f"{ns.url}/v1/brokers/register", json=reg) as resp:
                    assert resp.status == 200, await resp.text()
        yield ns.url.removeprefix("http://"), counts
    finally:
        for server in servers:
            server.close()
        await ns.stop()


def run(body: Callable[[], Any]) -> None:
    asyncio.run(body())


@pytest.mark.slow
def test_a_node_that_reads_and_closes_gets_at_most_100_connections_in_20_s() -> None:
    """The bar: the send's whole 20 s deadline against the only node, which reads and closes."""
    async def body() -> None:
        async with cluster(("bad", True)) as (ns, counts):
            async with Producer(ns, send_timeout_s=20.0) as p:
                with pytest.raises(SendTimeoutError):
                    await p.send(Message("t", b"x"))
            assert 3 <= counts["bad"][0] <= 100, counts  # dialled again, but not hammered

    run(body)


def test_a_send_leaves_a_node_that_reads_and_closes_for_a_healthy_member() -> None:
    """The route names the closing node as leader; the send goes to the group's other member
    after a few closes, and later sends go straight there."""
    async def body() -> None:
        async with cluster(("bad", True), ("good", False)) as (ns, counts):
            async with Producer(ns, send_timeout_s=20.0) as p:
                first = await p.send(Message("t", b"x"))
                after = counts["bad"][0]
                later = [await p.send(Message("t", b"y%d" % i)) for i in range(5)]
            assert first.node == "good" and {r.node for r in later} == {"good"}
            assert 1 <= after <= 3, counts  # left after its third close in a row
            assert counts["bad"][0] == after  # not dialled again while "good" answers

    run(body)
