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
import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

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
CLOSE = "close"  # a node's action on a request: read it and close the connection
OK = "SEND_OK"  # answer it as a leader that stored it; any other status: refuse every run so


class FakeNode:
    """A node of group ``group`` that acts on its k-th request as ``plan[k]`` says (the last
    action repeating); counts the connections it accepts and the requests it reads."""

    def __init__(self, group: str, name: str, plan: list[str]) -> None:
        self.group, self.name, self.plan = group, name, plan
        self.accepted = 0
        self.requests = 0

    def act(self, conn: Node, payload: bytes) -> None:
        action = self.plan[min(self.requests, len(self.plan) - 1)]
        self.requests += 1
        if action == CLOSE:
            assert conn.transport is not None
            conn.transport.close()
            return
        req = decode_request(payload, bp.SEND_KINDS)
        assert req.kind == bp.SEND_RUNS
        runs = req.args[0]
        answer = ok(self.group, runs) if action == OK else [[action, "refused"] for _ in runs]
        conn.send_payload(encode_result(req.request_id, answer))


class Node(FramedProtocol):
    def __init__(self, node: FakeNode) -> None:
        super().__init__()
        self.node = node

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.node.accepted += 1
        super().connection_made(transport)

    def payload_received(self, payload: bytes) -> None:
        self.node.act(self, payload)


@asynccontextmanager
async def cluster(*nodes: FakeNode) -> AsyncIterator[str]:
    """A NameServer routing topic ``t`` to the groups of ``nodes`` (the first node of each group
    its leader), each node a server on 127.0.0.1 port 0; yields the NameServer's address."""
    servers = []
    leaders: dict[str, str] = {}
    ns = NameServer("127.0.0.1", 0, insecure=True)
    await ns.start()
    try:
        async with aiohttp.ClientSession() as http:
            for n in nodes:
                server = await asyncio.get_running_loop().create_server(
                    functools.partial(Node, n), "127.0.0.1", 0)
                servers.append(server)
                leader = leaders.setdefault(n.group, n.name)
                reg = registration(n.name, "leader" if leader == n.name else "follower",
                                   group=n.group, port=server.sockets[0].getsockname()[1],
                                   topics=TOPICS, leader=leader)
                async with http.post(f"{ns.url}/v1/brokers/register", json=reg) as resp:
                    assert resp.status == 200, await resp.text()
        yield ns.url.removeprefix("http://")
    finally:
        for server in servers:
            server.close()
        await ns.stop()


@pytest.mark.slow
def test_a_node_that_reads_and_closes_gets_at_most_100_connections_in_20_s() -> None:
    """The bar: the send's whole 20 s deadline against the only node, which reads and closes."""
    async def body() -> None:
        bad = FakeNode("a", "bad", [CLOSE])
        async with cluster(bad) as ns, Producer(ns, send_timeout_s=20.0) as p:
            with pytest.raises(SendTimeoutError):
                await p.send(Message("t", b"x"))
        assert 3 <= bad.accepted <= 100, bad.accepted  # dialled again, but not hammered

    asyncio.run(body())


def test_a_send_leaves_a_node_that_reads_and_closes_for_a_healthy_member() -> None:
    """The route names the closing node as leader; the send goes to the group's other member
    after a few closes, and later sends go straight there."""
    async def body() -> None:
        bad, good = FakeNode("a", "bad", [CLOSE]), FakeNode("a", "good", [OK])
        async with cluster(bad, good) as ns, Producer(ns, send_timeout_s=20.0) as p:
            first = await p.send(Message("t", b"x"))
            after = bad.accepted
            later = [await p.send(Message("t", b"y%d" % i)) for i in range(5)]
        assert first.node == "good" and {r.node for r in later} == {"good"}
        assert 1 <= after <= 3, after  # left after its third close in a row
        assert bad.accepted == after  # not dialled again while "good" answers

    asyncio.run(body())
