"""The producer's client-side group commit, without a cluster (a NameServer in the test, so that
the producer starts; no broker): sends of one loop turn travel as one request; a send cancelled
before it left is not sent; every caller gets its own result or its own copy of the request's
error."""

from __future__ import annotations

import asyncio
from typing import Sequence

import pytest

from client import Message, Producer, SendTimeoutError
from client.types import MessageQueue, SendResult
from namesrv.server import NameServer


async def started_producer() -> tuple[Producer, NameServer]:
    server = NameServer("127.0.0.1", 0)
    host, port = await server.start()
    return await Producer(f"{host}:{port}").start(), server


class FakeBroker:
    def __init__(self, fail: Exception | None = None) -> None:
        self.requests: list[list[bytes]] = []
        self.fail = fail

    async def send_request(self, topic: str, messages: Sequence[Message]) -> list[SendResult]:
        self.requests.append([m.body for m in messages])
        await asyncio.sleep(0)  # the network
        if self.fail is not None:
            raise self.fail
        mq = MessageQueue(topic, "g", 0)
        return [SendResult("SEND_OK", f"K{k}", f"g-0-{k}", mq, k) for k in range(len(messages))]


def test_sends_of_one_turn_share_a_request_and_a_cancelled_one_is_not_sent() -> None:
    async def run() -> None:
        broker = FakeBroker()
        p, server = await started_producer()
        p._send_request = broker.send_request  # type: ignore[method-assign]
        a = asyncio.ensure_future(p.send(Message("t", b"a")))
        b = asyncio.ensure_future(p.send(Message("t", b"b")))
        c = asyncio.ensure_future(p.send(Message("t", b"c")))
        other = asyncio.ensure_future(p.send(Message("u", b"x")))
        await asyncio.sleep(0)  # the three sends have queued their messages
        b.cancel()
        ra, rc, rx = await asyncio.gather(a, c, other)
        assert broker.requests == [[b"a", b"c"], [b"x"]]  # one request per topic; b never left
        assert (ra.queue_offset, rc.queue_offset, rx.queue_offset) == (0, 1, 0)
        assert b.cancelled()
        await p.close()
        await server.stop()

    asyncio.run(run())


def test_every_caller_gets_its_own_copy_of_the_requests_error() -> None:
    async def run() -> None:
        broker = FakeBroker(fail=SendTimeoutError("outcome unknown"))
        p, server = await started_producer()
        p._send_request = broker.send_request  # type: ignore[method-assign]
        results = await asyncio.gather(*(p.send(Message("t", b"m%d" % i)) for i in range(3)),
                                       return_exceptions=True)
        assert len(broker.requests) == 1
        assert all(isinstance(r, SendTimeoutError) for r in results)
        assert len({id(r) for r in results}) == 3
        with pytest.raises(SendTimeoutError):
            await p.send(Message("t", b"again"))
        await p.close()
        await server.stop()

    asyncio.run(run())
