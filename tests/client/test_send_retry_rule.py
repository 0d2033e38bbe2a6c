"""One retry rule for every send, async or blocking (issue 34 item 13; docs/client.md, "Retries"):
an attempt whose outcome is unknown is asked again of the *same* group, which stores a unique
key once; an attempt that certainly stored nothing moves to another group. RocketMQ's 4.x
notes say an async send retries on the same broker only; RocketMQ 5's async retries pick another
broker as its sync sends do, on timeouts too. Ours keeps the same group exactly where a retry
elsewhere could store the message twice, and moves where staying could only fail again.

Both forms are run: ``Producer.send`` as a task with a done callback (RocketMQ's async send with
a SendCallback) and ``SyncProducer.send`` (the blocking twin, on its own loop's thread). Topic
``t`` is served by groups ``a`` and ``b`` of one fake node each (``test_closing_node``); every
send starts its round robin at group ``a``'s first queue."""

from __future__ import annotations

import asyncio

import pytest

from client import Message, Producer, SendResult, SyncProducer
from client.producer import delivery
from tests.client.test_closing_node import CLOSE, OK, FakeNode, cluster


@pytest.fixture(autouse=True)
def _round_robin_from_group_a(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delivery, "first_index", lambda: 0)


async def send(ns: str, form: str) -> SendResult:
    """One message, sent in ``form``: "async" (a task and its callback) or "sync"."""
    if form == "sync":
        p = await asyncio.to_thread(SyncProducer, ns, 10.0)
        try:
            return await asyncio.to_thread(p.send, Message("t", b"m"))
        finally:
            await asyncio.to_thread(p.close)
    async with Producer(ns, 10.0) as producer:
        called: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(producer.send(Message("t", b"m")))
        task.add_done_callback(lambda t: called.set_result(t.result()))  # on success
        return await called


@pytest.mark.parametrize("form", ["async", "sync"])
def test_an_unknown_outcome_is_retried_on_the_same_group(form: str) -> None:
    """Group a's node reads the first attempt and closes the connection: it may have stored
    it. The retry goes to group a again (with the same unique key), never to b."""
    async def body() -> None:
        a, b = FakeNode("a", "a0", [CLOSE, OK]), FakeNode("b", "b0", [OK])
        async with cluster(a, b) as ns:
            result = await send(ns, form)
        assert result.queue.group == "a" and (a.requests, b.requests) == (2, 0)

    asyncio.run(body())


@pytest.mark.parametrize("form", ["async", "sync"])
def test_a_certain_failure_moves_to_another_group(form: str) -> None:
    """Group a refuses the message (nothing stored): it moves to group b at once."""
    async def body() -> None:
        a, b = FakeNode("a", "a0", ["NO_PERMISSION"]), FakeNode("b", "b0", [OK])
        async with cluster(a, b) as ns:
            result = await send(ns, form)
        assert result.queue.group == "b" and (a.requests, b.requests) == (1, 1)

    asyncio.run(body())
