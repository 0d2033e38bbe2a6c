"""The producer's client-side group commit, without a cluster: the sends of one loop turn get a
queue each (round robin) and travel as one request per group, a run per queue; a send cancelled
before it left is not sent; every caller gets its own result or its own copy of an error; what
failed on a group is chosen again, away from it, with its unique keys kept.

The network is the only stand-in: ``Net`` answers the producer's requests to group leaders
(``Delivery._call``); routes are the real ``Routes`` with its cache filled in (no NameServer
answers, so a refresh falls back to the cache, as it does in a cluster without one)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from client import Message, NoPermissionError, Producer, SendTimeoutError, UnavailableError
from client.cluster.routes import GroupRoute, Routes, TopicRoute
from client.producer import delivery
from client.producer.delivery import Delivery
from dledger.localcluster import free_ports
from protocol import broker_kinds as bp

Respond = Callable[[str, list[Any]], Any]  # (group, runs) -> answers, or raises


class Net(Delivery):
    """Group leaders that answer by ``respond``; every request is recorded."""

    def __init__(self, routes: Routes, respond: Respond, unknown: bool = False) -> None:
        super().__init__(routes)
        self.respond = respond
        self.unknown = unknown
        self.requests: list[tuple[str, int, list[Any]]] = []

    async def _call(self, group: GroupRoute, kind: int, args: list[Any], deadline: float,
                    retry: bool, share_s: float | None) -> tuple[str, Any, bool]:
        self.requests.append((group.group, kind, args))
        await asyncio.sleep(0)  # the network
        return "n0", self.respond(group.group, args[0]), self.unknown


@pytest.fixture(autouse=True)
def _round_robin_from_queue_0(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests name the queue each message takes: the round robin starts at the first
    (a producer's starts at a random one, ``delivery.first_index``)."""
    monkeypatch.setattr(delivery, "first_index", lambda: 0)


def ok(group: str, runs: list[Any]) -> list[Any]:
    return [["SEND_OK", q, list(range(len(ms))), [f"{group}-{t}-{q}-{k}" for k in range(len(ms))],
             [False] * len(ms), [q] * len(ms)] for t, q, ms in runs]


def route(topic: str, *groups: str, queues: int = 2) -> TopicRoute:
    return TopicRoute(topic, tuple(GroupRoute(g, "n0", {"n0": ("127.0.0.1", 1)}, queues, queues, 6)
                                   for g in groups), time.monotonic(), True)


async def producer(respond: Respond, *routes: TopicRoute, unknown: bool = False) -> tuple[Producer, Net]:
    p = Producer(f"127.0.0.1:{free_ports(1)[0]}")  # nothing listens there
    p._routes._session = aiohttp.ClientSession()  # (what start() opens)
    p._life.begin_start()  # started without a NameServer: the routes are given below
    p._life.end_start(True)
    for r in routes:
        p._routes._routes[r.topic] = r
    net = Net(p._routes, respond, unknown)
    p._delivery = net
    return p, net


def runs_of(net: Net) -> list[tuple[str, list[tuple[str, int, list[bytes]]]]]:
    return [(g, [(t, q, [m[0] for m in ms]) for t, q, ms in args[0]])
            for g, _, args in net.requests]


def test_short_lived_producers_start_their_round_robin_anywhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Four producers sending one message each (four `dledger send` runs) to a 4-queue topic
    do not all land on queue 0: each starts at a random queue (the draws given here)."""
    draws = iter([4, 5, 2, 7])  # (queues 0, 1, 2, 3 of 4)
    monkeypatch.setattr(delivery, "first_index", lambda: next(draws))
    assert len({delivery._random_first_index() for _ in range(64)}) > 1  # production's draw

    async def one() -> int:
        p, _ = await producer(ok, route("t", "a", queues=4))
        r = await p.send(Message("t", b"x"))
        await p.close()
        return r.queue.queue_id
    assert [asyncio.run(one()) for _ in range(4)] == [0, 1, 2, 3]


def test_one_turn_goes_as_one_request_per_group_with_a_queue_per_message() -> None:
    async def run() -> None:
        p, net = await producer(ok, route("t", "a", "b"), route("u", "a"))
        sends = [asyncio.ensure_future(p.send(Message("t", b"t%d" % i))) for i in range(5)]
        sends += [asyncio.ensure_future(p.send(Message("u", b"u%d" % i))) for i in range(2)]
        await asyncio.sleep(0)  # the sends have queued their messages
        sends[1].cancel()  # before it left: never sent
        results = await asyncio.gather(*sends[:1], *sends[2:])
        assert {k for _, k, _ in net.requests} == {bp.SEND_RUNS}
        # round robin per message over (a,0) (a,1) (b,0) (b,1); t1 never left
        assert runs_of(net) == [
            ("a", [("t", 0, [b"t0"]), ("t", 1, [b"t2"]), ("u", 0, [b"u0"]), ("u", 1, [b"u1"])]),
            ("b", [("t", 0, [b"t3"]), ("t", 1, [b"t4"])])]
        assert [(r.queue.group, r.queue.queue_id) for r in results] == [
            ("a", 0), ("a", 1), ("b", 0), ("b", 1), ("a", 0), ("a", 1)]
        assert [r.offset_msg_id for r in results[:3]] == ["a-t-0-0", "a-t-1-0", "b-t-0-0"]
        assert len({r.msg_id for r in results}) == 6 and sends[1].cancelled()
        await p.close()

    asyncio.run(run())


def test_every_caller_gets_its_own_copy_of_the_requests_error() -> None:
    def timeout(group: str, runs: list[Any]) -> Any:
        raise SendTimeoutError("outcome unknown")

    async def run() -> None:
        p, net = await producer(timeout, route("t", "a"))
        results = await asyncio.gather(*(p.send(Message("t", b"m%d" % i)) for i in range(3)),
                                       return_exceptions=True)
        assert len(net.requests) == 1  # the only group, silent: no other to try
        assert all(isinstance(r, SendTimeoutError) for r in results)
        assert len({id(r) for r in results}) == 3
        with pytest.raises(SendTimeoutError):
            await p.send(Message("t", b"again"))
        await p.close()

    asyncio.run(run())


def test_a_run_refused_as_read_only_moves_to_another_group_with_its_unique_keys() -> None:
    def a_read_only_for_t(group: str, runs: list[Any]) -> list[Any]:
        answers = ok(group, runs)
        return [["NO_PERMISSION", "t is not writable"] if group == "a" and t == "t" else ans
                for (t, _, _), ans in zip(runs, answers)]

    async def run() -> None:
        p, net = await producer(a_read_only_for_t, route("t", "a", "b"), route("u", "a"))
        results = await asyncio.gather(*(p.send(Message("t", b"t%d" % i)) for i in range(4)),
                                       p.send(Message("u", b"u0")))
        assert [(r.queue.group, r.queue.queue_id) for r in results] == [
            ("b", 0), ("b", 1), ("b", 0), ("b", 1), ("a", 0)]  # t0, t1 chosen again, on b
        first, retry = net.requests[0], net.requests[2]
        assert first[0] == "a" and retry[0] == "b"
        keys = {m[0]: m[3] for t, q, ms in first[2][0] for m in ms}
        assert {m[0]: m[3] for t, q, ms in retry[2][0] for m in ms} == {
            b"t0": keys[b"t0"], b"t1": keys[b"t1"]}  # the same unique keys
        assert [r.msg_id for r in results[:2]] == [keys[b"t0"], keys[b"t1"]]
        await p.close()

    asyncio.run(run())


def test_a_refusal_after_an_unknown_outcome_is_reported_as_unknown_and_not_moved() -> None:
    def read_only(group: str, runs: list[Any]) -> list[Any]:
        return [["NO_PERMISSION", "t is not writable"] for _ in runs]

    async def run() -> None:
        p, net = await producer(read_only, route("t", "a", "b"), unknown=True)
        with pytest.raises(SendTimeoutError, match="outcome unknown"):
            await p.send(Message("t", b"m"))  # an earlier try on that group may have stored it
        assert len(net.requests) == 1
        await p.close()

    asyncio.run(run())


def test_a_failed_group_is_left_and_its_messages_chosen_again_elsewhere() -> None:
    def a_down(group: str, runs: list[Any]) -> list[Any]:
        if group == "a":
            raise UnavailableError("no node of a answered")
        return ok(group, runs)

    async def run() -> None:
        p, net = await producer(a_down, route("t", "a", "b"))
        results = await asyncio.gather(*(p.send(Message("t", b"m%d" % i)) for i in range(4)))
        assert {r.queue.group for r in results} == {"b"}
        assert [g for g, _, _ in net.requests] == ["a", "b", "b"]  # a is isolated afterwards
        later = await p.send(Message("t", b"later"))
        assert later.queue.group == "b" and net.requests[-1][0] == "b"
        await p.close()

    asyncio.run(run())


def test_no_writable_group_fails_with_no_permission_at_once() -> None:
    async def run() -> None:
        read_only = TopicRoute("t", (GroupRoute("a", "n0", {"n0": ("127.0.0.1", 1)}, 2, 2, 4),),
                               time.monotonic(), True)
        p, net = await producer(ok, read_only)
        with pytest.raises(NoPermissionError):
            await p.send(Message("t", b"m"))
        assert net.requests == []
        await p.close()

    asyncio.run(run())
