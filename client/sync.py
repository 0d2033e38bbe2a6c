"""Blocking versions of the producer and the pull consumer, with the same method names: each
runs its async twin on a private event loop in a thread (DESIGN.md section 6)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine, Sequence, TypeVar

from client.consumer import PullConsumer
from client.producer import Producer
from client.types import Message, MessageQueue, PullResult, SendResult

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="dledger-client",
                                       daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


class SyncProducer:
    def __init__(self, namesrv: str | Sequence[str], send_timeout_s: float = 3.0,
                 retries: int = 2) -> None:
        self._lt = _LoopThread()
        self._p = Producer(namesrv, send_timeout_s, retries)
        self._limit_s = send_timeout_s * (retries + 2) + 5  # every wait has a deadline
        self._lt.run(self._p.start(), self._limit_s)

    def send(self, message: Message) -> SendResult:
        return self._lt.run(self._p.send(message), self._limit_s)

    def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        return self._lt.run(self._p.send_batch(messages), self._limit_s * max(1, len(messages)))

    def close(self) -> None:
        self._lt.run(self._p.close(), self._limit_s)
        self._lt.stop()


class SyncPullConsumer:
    def __init__(self, namesrv: str | Sequence[str], group: str, timeout_s: float = 3.0) -> None:
        self._lt = _LoopThread()
        self._c = PullConsumer(namesrv, group, timeout_s)
        self._limit_s = timeout_s + 20
        self._lt.run(self._c.start(), self._limit_s)

    def fetch_queues(self, topic: str) -> list[MessageQueue]:
        return self._lt.run(self._c.fetch_queues(topic), self._limit_s)

    def pull(self, mq: MessageQueue, offset: int, max_messages: int = 32,
             suspend_ms: int = 0) -> PullResult:
        return self._lt.run(self._c.pull(mq, offset, max_messages, suspend_ms), self._limit_s)

    def offset_for_timestamp(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self._lt.run(self._c.offset_for_timestamp(mq, timestamp_ms), self._limit_s)

    def commit(self, mq: MessageQueue, offset: int) -> None:
        self._lt.run(self._c.commit(mq, offset), self._limit_s)

    def committed(self, mq: MessageQueue) -> int:
        return self._lt.run(self._c.committed(mq), self._limit_s)

    def close(self) -> None:
        self._lt.run(self._c.close(), self._limit_s)
        self._lt.stop()
