"""The gRPC endpoint's gathering of its own group's sends (``broker.frontends.gather``),
against a stand-in for the broker API's ``send_runs`` whose requests the test answers: a lone
send goes at once; sends that arrive while a request is under way travel together in the next;
after a request, the next waits for as many callers as were under way at once (bounded by the
linger); each message is its own run, answered or refused alone; a failed request fails its
callers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from broker.frontends.gather import SendGather
from protocol.errors import ProposalTimeoutError


class FakeApi:
    """``send_runs`` that waits for the test to answer each request."""

    def __init__(self) -> None:
        self.requests: list[tuple[list[list[Any]], asyncio.Future[list[Any]]]] = []

    async def send_runs(self, runs: list[list[Any]], timeout_s: float) -> list[Any]:
        fut: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.requests.append((runs, fut))
        return await fut

    def answer(self, k: int) -> None:
        runs, fut = self.requests[k]
        fut.set_result([["SEND_OK", q, [i], [f"id-{i}"], [False], [q]]
                        for i, (_, q, _) in enumerate(runs)])


def row(body: bytes) -> list[Any]:
    return [body, "", [], body.decode(), [], 0]


async def until(cond: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0)  # (the loop's turns: the gather works in them)


def test_a_lone_send_goes_at_once_and_later_ones_travel_together() -> None:
    async def main() -> None:
        api = FakeApi()
        gather = SendGather(api.send_runs, 1.0, linger_s=0)
        first = gather.send("t", 0, row(b"a"))
        await until(lambda: len(api.requests) == 1, "the first request")
        later = [gather.send("t", q, row(b"m%d" % q)) for q in range(1, 4)]
        for _ in range(10):
            await asyncio.sleep(0)
        assert len(api.requests) == 1  # one request under way at a time
        api.answer(0)
        assert (await first)[0] == "SEND_OK"
        await until(lambda: len(api.requests) == 2, "the gathered request")
        assert [run[:2] for run in api.requests[1][0]] == [["t", 1], ["t", 2], ["t", 3]]
        api.answer(1)
        assert [(await f)[1] for f in later] == [1, 2, 3]  # each its own run's answer
        assert gather.requests == 2
    asyncio.run(main())


def test_after_a_request_the_next_waits_for_as_many_callers_as_were_under_way() -> None:
    async def main() -> None:
        api = FakeApi()
        gather = SendGather(api.send_runs, 1.0, linger_s=60)  # (only the count ends the wait)
        first = gather.send("t", 0, row(b"a"))
        await until(lambda: len(api.requests) == 1, "the first request")
        waiting = [gather.send("t", 0, row(b"m%d" % i)) for i in range(3)]
        api.answer(0)  # four were under way at once: the next request waits for four
        await first
        for _ in range(10):
            await asyncio.sleep(0)
        assert len(api.requests) == 1
        waiting.append(gather.send("t", 0, row(b"again")))  # the first caller's next send
        await until(lambda: len(api.requests) == 2, "the four")
        assert len(api.requests[1][0]) == 4
        api.answer(1)
        await asyncio.gather(*waiting)
        await gather.close()
    asyncio.run(main())


def test_a_refused_run_answers_its_message_alone_and_a_failed_request_fails_its_callers() -> None:
    async def main() -> None:
        api = FakeApi()
        gather = SendGather(api.send_runs, 1.0, linger_s=0)
        first = gather.send("t", 0, row(b"a"))
        await until(lambda: len(api.requests) == 1, "the first request")
        a, b = gather.send("t", 1, row(b"b")), gather.send("t", 2, row(b"c"))
        api.requests[0][1].set_exception(ProposalTimeoutError("late"))
        with pytest.raises(ProposalTimeoutError):
            await first
        await until(lambda: len(api.requests) == 2, "the next request")
        api.requests[1][1].set_result([["MESSAGE_TOO_LARGE", "b"], ["SEND_OK", 2, [0], ["x"],
                                                                     [False], [2]]])
        assert await a == ["MESSAGE_TOO_LARGE", "b"] and (await b)[0] == "SEND_OK"
    asyncio.run(main())
