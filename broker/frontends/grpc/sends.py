"""The gRPC endpoint's sends that travel together (``broker.frontends.grpc.gateway``): NORMAL and DELAY
messages of concurrent SendMessage calls that arrive in one turn of the event loop go to the
groups' leaders as one request per group, as our own producer's sends do (``client.producer.producer``:
each message to its own queue, round robin over the topic's writable queues of every group).
A FIFO message goes alone to the queue its message group selects (``Delivery.to_queue``).

The calls of a RocketMQ client arrive one by one (it sends the next as one completes), not in
one turn, so at most ``IN_FLIGHT_MAX`` deliveries are under way at once: what arrives meanwhile
waits for one of them to end and then travels together (a group commit that adds no wait when
the endpoint is idle). Each entry then carries many messages, as our own producer's do."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from client.producer.delivery import Attempt, Delivery, Sends, chunks
from client.producer.producer import SEND_GROUP_BYTES, SEND_GROUP_MAX
from client.types import SendResult

SEND_ATTEMPTS = 3  # attempts of one send inside the cluster (the client retries as well)
IN_FLIGHT_MAX = 2  # deliveries under way at once; later sends gather meanwhile


class GatewaySends:
    def __init__(self, delivery: Delivery, timeout_s: float) -> None:
        self.delivery = delivery
        self.timeout_s = timeout_s
        self._pending: list[tuple[str, list[Any], bool, asyncio.Future[SendResult]]] = []
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    def send(self, topic: str, row: list[Any], delayed: bool) -> asyncio.Future[SendResult]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[SendResult] = loop.create_future()
        self._pending.append((topic, row, delayed, fut))
        if not self._scheduled and len(self._tasks) < IN_FLIGHT_MAX:
            self._scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        self._scheduled = False
        if not self._pending:
            return
        items = [x for x in self._pending if not x[3].done()]
        self._pending = []
        # a broker takes a run of delayed messages or of immediate ones, not both
        for part in ([x for x in items if not x[2]], [x for x in items if x[2]]):
            for chunk in chunks(part, SEND_GROUP_BYTES, SEND_GROUP_MAX, lambda x: len(x[1][0])):
                sends = Sends([t for t, *_ in chunk], [r for _, r, _, _ in chunk],
                              [f for *_, f in chunk])
                attempt = Attempt(time.monotonic() + self.timeout_s, SEND_ATTEMPTS)
                task = asyncio.get_running_loop().create_task(self._deliver(sends, attempt))
                self._tasks.add(task)
                task.add_done_callback(self._delivered)

    def _delivered(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._pending and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    async def _deliver(self, sends: Sends, attempt: Attempt) -> None:
        try:
            await self.delivery.deliver(sends, list(range(len(sends.topics))), attempt, True)
        except asyncio.CancelledError:
            sends.cancel()
            raise
        except Exception as err:  # noqa: BLE001 - handed to every caller still waiting
            sends.fail_all(err)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


__all__ = ["GatewaySends"]
