"""The benchmark's load drivers, against a fake proposer (no cluster)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from bench.load import closed_loop, paced_loop
from dledger.local_load import chained_loop
from protocol.errors import NotLeaderError, OverloadedError


class FakeNode:
    """submit() returns a future that the loop resolves on its next turn; every seventh
    submission fails at once (NotLeader), every eleventh fails later (Overloaded)."""

    def __init__(self) -> None:
        self.submitted = 0
        self.outstanding = 0
        self.max_outstanding = 0

    def submit(self) -> asyncio.Future[object]:
        self.submitted += 1
        n = self.submitted
        if n % 7 == 0:
            raise NotLeaderError(None, 1)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[object] = loop.create_future()
        self.outstanding += 1
        self.max_outstanding = max(self.max_outstanding, self.outstanding)
        loop.call_soon(self._finish, fut, n)
        return fut

    def _finish(self, fut: asyncio.Future[object], n: int) -> None:
        self.outstanding -= 1
        if n % 11 == 0:
            fut.set_exception(OverloadedError("full"))
        else:
            fut.set_result(n)


def test_chained_loop_issues_every_call_keeps_the_concurrency_and_counts_failures() -> None:
    node = FakeNode()
    latencies, elapsed, failures = asyncio.run(chained_loop(node.submit, 300, 8, 50))
    assert node.submitted == 350
    assert node.max_outstanding == 8
    failed = {n for n in range(1, 351) if n % 7 == 0 or n % 11 == 0}
    assert failures == len(failed)  # warm-up failures count too
    assert len(latencies) == 300 - len(failed - set(range(1, 51)))
    assert elapsed > 0 and all(ms >= 0 for ms in latencies)


def test_closed_loop_matches_chained_loop_on_the_same_calls() -> None:
    node = FakeNode()

    async def call() -> object:
        return await node.submit()

    latencies, _, failures = asyncio.run(closed_loop(call, 300, 1, 50))
    assert node.submitted == 350
    failed = {n for n in range(1, 351) if n % 7 == 0 or n % 11 == 0}
    assert (len(latencies), failures) == (300 - len(failed - set(range(1, 51))), len(failed))


def test_chained_loop_hands_on_an_unexpected_error_instead_of_hanging() -> None:
    node = FakeNode()

    def submit() -> asyncio.Future[object]:
        if node.submitted == 20:
            raise RuntimeError("broken proposer")
        return node.submit()

    async def run() -> None:
        await asyncio.wait_for(chained_loop(submit, 100, 4, 0), 5)

    with pytest.raises(RuntimeError, match="broken proposer"):
        asyncio.run(run())


def test_closed_loop_gives_each_caller_its_own_call_when_asked() -> None:
    made: list[int] = []

    def maker(i: int) -> Callable[[], Awaitable[object]]:
        async def call() -> object:
            made.append(i)
            await asyncio.sleep(0)
            return i
        return call

    calls = [maker(i) for i in range(4)]
    latencies, _, failures = asyncio.run(closed_loop(calls[0], 80, 8, 16, per_caller=calls))
    # 8 callers over 4 calls: caller i makes calls[i % 4], so each call is made by two callers
    assert (len(latencies), failures) == (80, 0)
    assert sorted(set(made)) == [0, 1, 2, 3] and all(made.count(i) == 24 for i in range(4))


def test_closed_loop_counts_the_failures_it_is_told_of() -> None:
    async def call() -> object:
        raise KeyError("refused")

    assert asyncio.run(closed_loop(call, 10, 2, 0, failure=(KeyError,)))[2] == 10 + 2
    with pytest.raises(KeyError):  # an error not named as a failure is not swallowed
        asyncio.run(closed_loop(call, 10, 2, 0))


def test_paced_loop_makes_rate_times_duration_calls_no_faster_than_the_rate() -> None:
    calls = 0

    async def call() -> object:
        nonlocal calls
        calls += 1
        if calls % 5 == 0:
            raise KeyError("refused")
        return calls

    latencies, elapsed, failures = asyncio.run(paced_loop(call, 200.0, 0.1, failure=(KeyError,)))
    assert (calls, len(latencies), failures) == (20, 16, 4)
    assert elapsed >= 19 / 200  # the 20th call starts 95 ms after the first, however loaded
