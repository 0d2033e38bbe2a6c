"""How a group's connection pool (``LogClient``) learns its leader, on real sockets against small
servers written here: a node that never answers (silent: paused or cut off), one that answers as
leader, and followers that answer NOT_LEADER with a hint and their term (issue 16 item 1).

The rules: a node that answers a leader-only request leads; a hint names the leader at its term,
and an older term's hint is stale; a route (the NameServer's, possibly stale) never overrides what
the answers taught, nor names a silent node; a silent node is dialled only after the others until
it answers again (it is dialled again after a grace, in case it was only slow). No sleeps: a
silent node costs a request deadline, nothing else waits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from client.cluster.routes import GroupRoute, Routes
from dledger.client import LogClient, UnavailableError
from protocol.envelope import PROPOSE, decode_request, encode_error, encode_result
from protocol.errors import NotLeaderError, ProposalTimeoutError
from protocol.framed import FramedProtocol
from protocol.group_client import GroupClient

SILENT_S = 0.3  # the deadline of a request to a silent node


class FakeNode:
    """A log server that is ``silent`` (reads requests, never answers), the ``leader`` (answers
    every request) or a follower (answers NOT_LEADER naming ``hint`` at ``term``)."""

    def __init__(self, name: str, log: list[str], mode: str = "silent",
                 hint: str | None = None, term: int = 0) -> None:
        self.name, self.log, self.mode, self.hint, self.term = name, log, mode, hint, term
        self.server: asyncio.Server | None = None

    async def start(self) -> tuple[str, int]:
        self.server = await asyncio.get_running_loop().create_server(
            lambda: _Conn(self), "127.0.0.1", 0)
        host, port = self.server.sockets[0].getsockname()[:2]
        return host, port

    def answer(self, conn: _Conn, payload: bytes) -> None:
        req = decode_request(payload)
        self.log.append(self.name)
        if self.mode == "leader":
            conn.send_payload(encode_result(req.request_id, [1, 1]))
        elif self.mode == "follower":
            conn.send_payload(encode_error(req.request_id, NotLeaderError(self.hint, self.term)))


class _Conn(FramedProtocol):
    def __init__(self, node: FakeNode) -> None:
        super().__init__()
        self.node = node

    def payload_received(self, payload: bytes) -> None:
        self.node.answer(self, payload)


def run_group(body: Callable[[dict[str, FakeNode], dict[str, tuple[str, int]], list[str]],
                             Awaitable[None]], **modes: dict[str, Any]) -> None:
    """Start one FakeNode per keyword (its mode, hint, term), run ``body``, stop them."""
    async def main() -> None:
        log: list[str] = []
        nodes = {name: FakeNode(name, log, **kw) for name, kw in modes.items()}
        addrs = {name: await n.start() for name, n in nodes.items()}
        try:
            await body(nodes, addrs, log)
        finally:
            for n in nodes.values():
                assert n.server is not None
                n.server.close()
    asyncio.run(main())


async def _go_silent(client: LogClient, node: str) -> None:
    """A request to ``node`` (the known leader) that times out: the client marks it silent."""
    client.leader = node
    with pytest.raises(ProposalTimeoutError):
        await client.call_leader(PROPOSE, b"x", timeout_s=SILENT_S)


def test_a_node_that_answers_as_leader_is_remembered_over_a_stale_route() -> None:
    async def body(nodes: dict[str, FakeNode], addrs: dict[str, tuple[str, int]],
                   log: list[str]) -> None:
        route = GroupRoute("g", "a", addrs, 4, 4, 6)  # the NameServer still names a
        routes = Routes(["127.0.0.1:1"])
        client = routes.group_client(route)
        try:
            assert client.leader == "a"  # nothing learned yet: the route's word is taken
            await _go_silent(client, "a")
            node, _ = await client.call_leader(PROPOSE, b"x", timeout_s=2.0)
            assert node == "b" and client.leader == "b"
            assert routes.group_client(route) is client  # the stale route again ...
            assert client.leader == "b"  # ... does not put the silent node back first
            del log[:]
            for _ in range(3):
                assert (await client.call_leader(PROPOSE, b"x", timeout_s=2.0))[0] == "b"
            assert log == ["b", "b", "b"]
        finally:
            await routes.close()

    run_group(body, a={"mode": "silent"}, b={"mode": "leader"},
              c={"mode": "follower", "hint": "b", "term": 6})


def test_a_hint_teaches_the_leader_and_its_term_and_an_older_route_does_not_override_it() -> None:
    async def body(nodes: dict[str, FakeNode], addrs: dict[str, tuple[str, int]],
                   log: list[str]) -> None:
        async with LogClient(addrs, timeout_s=2.0) as client:
            client.leader = "a"
            node, _ = await client.call_leader(PROPOSE, b"x")
            assert (node, client.leader, client.term) == ("c", "c", 7)
            assert log == ["a", "c"]
            client.suggest("b", 6)  # a route from before the election
            assert client.leader == "c"
            client.suggest("b", 7)  # the same term, and a leader known from an answer
            assert client.leader == "c"
            nodes["c"].mode, nodes["c"].hint, nodes["c"].term = "follower", "b", 5
            nodes["b"].mode, nodes["b"].hint, nodes["b"].term = "follower", None, 8
            with pytest.raises(UnavailableError):  # c's hint (term 5) is stale: b is not taken
                await client.call_leader(PROPOSE, b"x", timeout_s=0.5)
            assert client.term == 8 and client.leader is None
            client.suggest("b", 9)  # a route newer than anything answered
            assert (client.leader, client.term) == ("b", 9)

    run_group(body, a={"mode": "follower", "hint": "c", "term": 7}, b={"mode": "follower"},
              c={"mode": "leader"})


def test_a_silent_node_is_tried_after_the_others_until_it_answers_again() -> None:
    async def body(nodes: dict[str, FakeNode], addrs: dict[str, tuple[str, int]],
                   log: list[str]) -> None:
        async with LogClient(addrs, timeout_s=2.0, silent_grace_s=0.2) as client:
            client.term = 5
            await _go_silent(client, "a")
            nodes["a"].mode = "leader"  # it was only slow: it leads still, at term 5
            del log[:]
            node, _ = await client.call_leader(PROPOSE, b"x", timeout_s=1.0)
            assert node == "a" and client.leader == "a"
            first_a = log.index("a")
            # b and c, which still name a at the term it went silent in, were asked first
            assert {"b", "c"} <= set(log[:first_a]), log
            assert not client.is_silent("a")  # it answered

    run_group(body, a={"mode": "silent"}, b={"mode": "follower", "hint": "a", "term": 5},
              c={"mode": "follower", "hint": "a", "term": 5})


def test_followers_that_still_name_a_silent_node_past_an_election_timeout_bring_it_back() -> None:
    """Its answers to this client were lost (the cut of chaos S21), not its peers' heartbeats:
    a hint at the term it went silent in, given ``leads_proof_s`` after the unanswered request,
    brings it back long before its grace; an earlier one does not."""
    async def body(nodes: dict[str, FakeNode], addrs: dict[str, tuple[str, int]],
                   log: list[str]) -> None:
        async with LogClient(addrs, timeout_s=2.0, silent_grace_s=60.0,
                             leads_proof_s=SILENT_S + 1.5) as client:
            client.term = 5
            await _go_silent(client, "a")
            nodes["a"].mode = "leader"  # its answers reach the client again
            del log[:]
            with pytest.raises(UnavailableError):  # too soon: an election may be under way
                await client.call_leader(PROPOSE, b"x", timeout_s=SILENT_S)
            assert "a" not in log and {"b", "c"} <= set(log)
            node, _ = await client.call_leader(PROPOSE, b"x", timeout_s=3.0)
            assert node == "a" and not client.is_silent("a") and client.leader == "a"

    run_group(body, a={"mode": "silent"}, b={"mode": "follower", "hint": "a", "term": 5},
              c={"mode": "follower", "hint": "a", "term": 5})


def test_a_hint_at_a_newer_term_brings_a_silent_node_back_at_once() -> None:
    async def body(nodes: dict[str, FakeNode], addrs: dict[str, tuple[str, int]],
                   log: list[str]) -> None:
        async with LogClient(addrs, timeout_s=2.0) as client:
            client.term = 5
            await _go_silent(client, "a")
            nodes["a"].mode = "leader"  # re-elected at term 6, as b says
            del log[:]
            node, _ = await client.call_leader(PROPOSE, b"x")
            assert node == "a" and log == ["b", "a"] and client.term == 6

    run_group(body, a={"mode": "silent"}, b={"mode": "follower", "hint": "a", "term": 6},
              c={"mode": "follower", "hint": "a", "term": 6})


def test_a_node_that_refuses_connections_is_not_put_back_first_by_a_stale_route() -> None:
    """The leader was killed: its port refuses. While the NameServer still routes it (the new
    leader not registered yet), every read of the route (a heartbeat round, another send)
    suggested it again, so each try went to the dead node until the deadline (a transaction's
    END, and every check-back answer, failed so for 15 s in one run)."""
    async def body(nodes: dict[str, FakeNode], addrs: dict[str, tuple[str, int]],
                   log: list[str]) -> None:
        dead = nodes["a"].server
        assert dead is not None
        dead.close()
        await dead.wait_closed()  # its port refuses from now on
        route = GroupRoute("g", "a", addrs, 4, 4, 6)  # the NameServer still names a
        routes = Routes(["127.0.0.1:1"])
        client = routes.group_client(route)
        stop = asyncio.Event()

        async def reread_route() -> None:
            while not stop.is_set():
                routes.group_client(route)
                await asyncio.sleep(0.005)  # another task of the client, reading the route
        rereads = asyncio.create_task(reread_route())
        try:
            node, _ = await client.call_leader(PROPOSE, b"x", timeout_s=2.0)
            assert node == "b" and client.leader == "b"
            assert client.is_silent("a")
        finally:
            stop.set()
            await rereads
            await routes.close()

    run_group(body, a={"mode": "leader"}, b={"mode": "leader"},
              c={"mode": "follower", "hint": "b", "term": 6})


def test_the_stale_leader_canary_brings_back_the_route_reseed() -> None:
    """The seeded bug the live scenario must catch: answers teach nothing, and the route puts
    the silent node back first."""
    async def body(nodes: dict[str, FakeNode], addrs: dict[str, tuple[str, int]],
                   log: list[str]) -> None:
        routes = Routes(["127.0.0.1:1"], canaries=["stale_leader"])
        route = GroupRoute("g", "a", addrs, 4, 4, 6)
        client = routes.group_client(route)
        try:
            await _go_silent(client, "a")
            assert (await client.call_leader(PROPOSE, b"x", timeout_s=2.0))[0] == "b"
            assert client.leader is None
            routes.group_client(route)
            assert client.leader == "a"
            client.leader = "b"
            routes.group_client(route)  # the route's word wins over what the client knew
            assert client.leader == "a"
        finally:
            await routes.close()

    run_group(body, a={"mode": "silent"}, b={"mode": "leader"}, c={"mode": "leader"})


def test_an_unknown_canary_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown client canaries"):
        Routes(["127.0.0.1:1"], canaries=["no_such_bug"])


def test_a_cancel_in_the_turn_the_connection_is_made_is_not_lost(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.11's ``wait_for`` returned the connection made in the loop turn its caller was
    cancelled, and the cancel was lost: the request went out and, to a node that does not
    answer, waited out its deadline (a push consumer closed right after it took a new queue
    waited for ever on its puller, which pulled on)."""
    async def body(nodes: dict[str, FakeNode], addrs: dict[str, tuple[str, int]],
                   log: list[str]) -> None:
        client = GroupClient(addrs, timeout_s=60.0)
        loop = asyncio.get_running_loop()
        connect = loop.create_connection
        callers: list[asyncio.Task[Any]] = []

        async def connect_then_cancel(*args: Any, **kwargs: Any) -> Any:
            made = await connect(*args, **kwargs)
            callers[0].cancel()  # the caller is cancelled as its connection is made
            return made
        monkeypatch.setattr(loop, "create_connection", connect_then_cancel)
        callers.append(asyncio.create_task(client.call("a", PROPOSE, b"x")))
        try:
            done, _ = await asyncio.wait(callers, timeout=10.0)
            assert done and callers[0].cancelled(), "the cancel was lost: the call went on"
        finally:
            callers[0].cancel()
            await client.close()

    run_group(body, a={"mode": "silent"})
