"""Blocking versions of the producer and the consumers, with the same method names: each runs its
async twin on a private event loop in a thread (DESIGN.md section 6), and each is a context
manager (``with SyncProducer(ns) as p: ...``). A call after ``close()`` raises
``ClientClosedError`` at once (the private loop is gone).

``SyncPushConsumer`` runs the listener on that private loop's thread, not the caller's: a
listener that blocks holds up the consumer's pulls, heartbeats and commits meanwhile, so it
should be quick, or hand the work to threads of its own."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any, Coroutine, Sequence, TypedDict, TypeVar, Unpack

from client.consumer import PullConsumer
from client.errors import ClientClosedError, ClientNotStartedError
from client.producer import Producer
from client.push import Listener, PushConsumer
from client.types import Message, MessageQueue, PullResult, SendResult

T = TypeVar("T")


class _LoopThread:
    def __init__(self, what: str) -> None:
        self.what = what
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="dledger-client",
                                       daemon=True)
        self.thread.start()
        self.closed = False

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        if self.closed:
            coro.close()
            raise ClientClosedError(f"{self.what} is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def start(self, coro: Coroutine[Any, Any, object], timeout_s: float) -> None:
        """Start the async twin; when that fails, stop the thread too (nothing left running)."""
        try:
            self.run(coro, timeout_s)
        except BaseException:
            self.stop()
            raise

    def close(self, coro: Coroutine[Any, Any, None], timeout_s: float) -> None:
        if self.closed:
            coro.close()
            return
        try:
            self.run(coro, timeout_s)
        finally:
            self.stop()

    def stop(self) -> None:
        self.closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.loop.close()


class SyncProducer:
    """Started by its constructor (fails fast when no NameServer answers)."""

    def __init__(self, namesrv: str | Sequence[str], send_timeout_s: float = 3.0,
                 retries: int = 2) -> None:
        self._lt = _LoopThread("SyncProducer")
        self._p = Producer(namesrv, send_timeout_s, retries)
        self._limit_s = send_timeout_s * (retries + 2) + 5  # every wait has a deadline
        self._lt.start(self._p.start(), self._limit_s)

    def send(self, message: Message) -> SendResult:
        return self._lt.run(self._p.send(message), self._limit_s)

    def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        return self._lt.run(self._p.send_batch(messages), self._limit_s * max(1, len(messages)))

    def close(self) -> None:
        self._lt.close(self._p.close(), self._limit_s)

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncPullConsumer:
    """Started by its constructor (fails fast when no NameServer answers)."""

    def __init__(self, namesrv: str | Sequence[str], group: str, timeout_s: float = 3.0) -> None:
        self._lt = _LoopThread(f"SyncPullConsumer of group {group!r}")
        self._c = PullConsumer(namesrv, group, timeout_s)
        self._limit_s = timeout_s + 20
        self._lt.start(self._c.start(), self._limit_s)

    def fetch_queues(self, topic: str) -> list[MessageQueue]:
        return self._lt.run(self._c.fetch_queues(topic), self._limit_s)

    def pull(self, mq: MessageQueue, offset: int, max_messages: int = 32,
             suspend_ms: int = 0, tags: Sequence[str] = ("*",),
             sql: str | None = None) -> PullResult:
        return self._lt.run(self._c.pull(mq, offset, max_messages, suspend_ms, tags, sql=sql),
                            self._limit_s + suspend_ms / 1000)

    def offset_for_timestamp(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self._lt.run(self._c.offset_for_timestamp(mq, timestamp_ms), self._limit_s)

    def commit(self, mq: MessageQueue, offset: int) -> None:
        self._lt.run(self._c.commit(mq, offset), self._limit_s)

    def committed(self, mq: MessageQueue) -> int:
        return self._lt.run(self._c.committed(mq), self._limit_s)

    def close(self) -> None:
        self._lt.close(self._c.close(), self._limit_s)

    def __enter__(self) -> SyncPullConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PushOptions(TypedDict, total=False):
    """PushConsumer's keyword options (see its constructor for their meaning and defaults)."""

    model: str
    strategy: str
    concurrency: int
    consume_batch_max: int
    pull_batch_max: int
    start_from: str
    heartbeat_s: float
    rebalance_s: float
    commit_s: float
    suspend_ms: int
    later_delay_s: float
    client_id: str | None
    start_timestamp_ms: int | None
    offset_store_dir: str | os.PathLike[str] | None
    max_reconsume_times: int
    consume_timeout_s: float


class SyncPushConsumer:
    """PushConsumer's blocking twin, same constructor: ``subscribe`` first, then ``start()`` (or
    ``with``); the listener runs on the private loop's thread (see the module docstring)."""

    def __init__(self, namesrv: str | Sequence[str], group: str, listener: Listener,
                 **options: Unpack[PushOptions]) -> None:
        self._c = PushConsumer(namesrv, group, listener, **options)  # binds no loop yet
        self._what = f"SyncPushConsumer of group {group!r}"
        self._lt: _LoopThread | None = None
        self._closed = False
        heartbeat_s = options.get("heartbeat_s", 5.0)
        self._limit_s = 2 * heartbeat_s + options.get("commit_s", 5.0) + 30

    def subscribe(self, topic: str, tags: str | None = "*", *, sql: str | None = None) -> None:
        self._c.subscribe(topic, tags, sql=sql)

    @property
    def client_id(self) -> str:
        return self._c.client_id

    @property
    def assigned(self) -> list[MessageQueue]:
        """The queues this member consumes now."""
        return self._loop().run(self._assigned(), self._limit_s)

    async def _assigned(self) -> list[MessageQueue]:
        return self._c.assigned

    def start(self) -> SyncPushConsumer:
        """Join the group and start consuming; a second start() does nothing."""
        if self._closed:
            raise ClientClosedError(f"{self._what} is closed: create a new one")
        if self._lt is None:
            lt = _LoopThread(self._what)
            lt.start(self._c.start(), self._limit_s)  # a failed start leaves it new: retry
            self._lt = lt
        return self

    def close(self) -> None:
        self._closed = True
        if self._lt is not None:
            self._lt.close(self._c.close(), self._limit_s)

    def _loop(self) -> _LoopThread:
        if self._closed:
            raise ClientClosedError(f"{self._what} is closed")
        if self._lt is None:
            raise ClientNotStartedError(f"{self._what} is not started: call start() first, or "
                                        f"use it in a with block")
        return self._lt

    def __enter__(self) -> SyncPushConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
