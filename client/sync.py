"""Blocking versions of the producer and the consumers, with the same method names: each runs its
async twin on a private event loop in a thread (docs/design.md), and each is a context
manager (``with SyncProducer(ns) as p: ...``). A call after ``close()`` raises
``ClientClosedError`` at once (the private loop is gone).

``SyncLitePullConsumer`` is the lite pull consumer's twin: ``poll()`` blocks the caller's
thread, and ``for message in consumer`` yields one message at a time until it is closed (from
another thread, or after the loop).

``SyncPushConsumer`` runs the listener on that private loop's thread, not the caller's: a
listener that blocks holds up the consumer's pulls, heartbeats and commits meanwhile, so it
should be quick, or hand the work to threads of its own."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import (
    Any,
    Generic,
    Protocol,
    Self,
    TypedDict,
    TypeVar,
    Unpack,
)

from client.consumer.lite import LitePullConsumer
from client.consumer.pull import PullConsumer
from client.consumer.push import PushConsumer
from client.consumer.rebalance import Strategy
from client.errors import ClientClosedError, ClientNotStartedError
from client.producer.producer import Producer
from client.producer.transaction import TransactionListener, TransactionProducer, TransactionSendResult
from client.types import Listener, Message, MessageQueue, PullResult, ReceivedMessage, SendResult
from protocol.auth import Credentials
from protocol.broker_kinds import MAX_MESSAGE_BYTES_CEILING

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
    """Started by its constructor (fails fast when no NameServer answers); the options are
    ``Producer``'s."""

    def __init__(self, namesrv: str | Sequence[str], send_timeout_s: float = 3.0,
                 retries: int = 2, *, group: str | None = None, trace: bool = False,
                 credentials: Credentials | None = None, tls_ca: str | None = None,
                 default_topic_queue_nums: int | None = None,
                 max_message_size_bytes: int = MAX_MESSAGE_BYTES_CEILING) -> None:
        self._lt = _LoopThread("SyncProducer")
        self._p = Producer(namesrv, send_timeout_s, retries, group=group, trace=trace,
                           credentials=credentials, tls_ca=tls_ca,
                           default_topic_queue_nums=default_topic_queue_nums,
                           max_message_size_bytes=max_message_size_bytes)
        self._limit_s = send_timeout_s * (retries + 2) + 5  # every wait has a deadline
        self._lt.start(self._p.start(), self._limit_s)

    def send(self, message: Message) -> SendResult:
        return self._lt.run(self._p.send(message), self._limit_s)

    def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        return self._lt.run(self._p.send_batch(messages), self._limit_s * max(1, len(messages)))

    def send_oneway(self, message: Message) -> None:
        """Hand ``message`` over and return: no answer awaited, no retry (``Producer``'s);
        ``close()`` waits for the oneway sends under way. A message the producer refuses before
        sending (too large, producer closed) raises here."""
        async def hand_over() -> None:
            self._p.send_oneway(message)
        self._lt.run(hand_over(), self._limit_s)

    def close(self) -> None:
        self._lt.close(self._p.close(), self._limit_s)

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncTransactionProducer:
    """A ``TransactionProducer`` on a private loop; started by its constructor. The listener's
    plain functions run on worker threads, as the async producer runs them."""

    def __init__(self, namesrv: str | Sequence[str], group: str, listener: TransactionListener,
                 *, send_timeout_s: float = 3.0, execute_timeout_s: float = 10.0,
                 check_timeout_s: float = 10.0, credentials: Credentials | None = None) -> None:
        self._lt = _LoopThread("SyncTransactionProducer")
        self._p = TransactionProducer(namesrv, group, listener, send_timeout_s=send_timeout_s,
                                      execute_timeout_s=execute_timeout_s,
                                      check_timeout_s=check_timeout_s, credentials=credentials)
        self._limit_s = 3 * send_timeout_s + execute_timeout_s + 5  # every wait has a deadline
        self._lt.start(self._p.start(), self._limit_s)

    @property
    def client_id(self) -> str:
        return self._p.client_id

    def send(self, message: Message, arg: object = None) -> TransactionSendResult:
        return self._lt.run(self._p.send(message, arg), self._limit_s)

    def producers(self) -> set[str]:
        return self._lt.run(self._p.producers(), self._limit_s)

    def close(self) -> None:
        self._lt.close(self._p.close(), self._limit_s)

    def __enter__(self) -> SyncTransactionProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncPullConsumer:
    """Started by its constructor (fails fast when no NameServer answers)."""

    def __init__(self, namesrv: str | Sequence[str], group: str, timeout_s: float = 3.0, *,
                 credentials: Credentials | None = None, tls_ca: str | None = None) -> None:
        self._lt = _LoopThread(f"SyncPullConsumer of group {group!r}")
        self._c = PullConsumer(namesrv, group, timeout_s, credentials=credentials, tls_ca=tls_ca)
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
    strategy: str | Strategy
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
    trace: bool
    credentials: Credentials | None


class _Startable(Protocol):
    async def start(self) -> object: ...
    async def close(self) -> None: ...


C = TypeVar("C", bound=_Startable)


class _StartedLater(Generic[C]):
    """The blocking twin of a consumer configured before it starts (``subscribe``, ``assign``):
    its private loop runs from ``start()`` (or ``with``) to ``close()``. A call before
    ``start()`` raises ``ClientNotStartedError``, after ``close()`` ``ClientClosedError``."""

    def __init__(self, consumer: C, what: str, limit_s: float) -> None:
        self._c = consumer  # binds no loop yet
        self._what, self._limit_s = what, limit_s
        self._lt: _LoopThread | None = None
        self._closed = False

    def start(self) -> Self:
        """Start the consumer; a second start() does nothing."""
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

    def _on_loop(self, read: Callable[[], T]) -> T:
        """``read()`` run on the consumer's loop (its state is that loop's alone)."""
        async def call() -> T:
            return read()
        return self._loop().run(call(), self._limit_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncPushConsumer(_StartedLater[PushConsumer]):
    """PushConsumer's blocking twin, same constructor: ``subscribe`` first, then ``start()`` (or
    ``with``); the listener runs on the private loop's thread (see the module docstring)."""

    def __init__(self, namesrv: str | Sequence[str], group: str, listener: Listener,
                 **options: Unpack[PushOptions]) -> None:
        heartbeat_s = options.get("heartbeat_s", 5.0)
        super().__init__(PushConsumer(namesrv, group, listener, **options),
                         f"SyncPushConsumer of group {group!r}",
                         2 * heartbeat_s + options.get("commit_s", 5.0) + 30)

    def subscribe(self, topic: str, tags: str | None = "*", *, sql: str | None = None) -> None:
        self._c.subscribe(topic, tags, sql=sql)

    @property
    def client_id(self) -> str:
        return self._c.client_id

    @property
    def assigned(self) -> list[MessageQueue]:
        """The queues this member consumes now."""
        return self._on_loop(lambda: self._c.assigned)


class LiteOptions(TypedDict, total=False):
    """LitePullConsumer's keyword options (see ``client.consumer.lite`` for their meaning and defaults)."""

    pull_batch_max: int
    poll_batch_max: int
    auto_commit: bool
    auto_commit_interval_s: float
    start_from: str
    start_timestamp_ms: int | None
    client_id: str | None
    heartbeat_s: float
    rebalance_s: float
    strategy: str | Strategy
    suspend_ms: int
    buffer_max: int
    timeout_s: float
    trace: bool
    credentials: Credentials | None


class SyncLitePullConsumer(_StartedLater[LitePullConsumer]):
    """LitePullConsumer's blocking twin, same constructor: ``subscribe`` or ``assign`` first,
    then ``start()`` (or ``with``)."""

    ITER_POLL_S = 1.0  # how long one wait of the iterator lasts (it then checks for close)

    def __init__(self, namesrv: str | Sequence[str], group: str,
                 **options: Unpack[LiteOptions]) -> None:
        c = LitePullConsumer(namesrv, group, **options)
        super().__init__(c, f"SyncLitePullConsumer of group {group!r}",
                         2 * c.handover_s + c.timeout_s + 30)

    def subscribe(self, topic: str, tags: str | None = "*", *, sql: str | None = None) -> None:
        self._c.subscribe(topic, tags, sql=sql)

    def assign(self, queues: Sequence[MessageQueue]) -> None:
        if self._lt is None:
            self._c.assign(queues)
        else:  # started: on the consumer's loop, where its rebalance runs
            self._on_loop(lambda: self._c.assign(queues))

    @property
    def client_id(self) -> str:
        return self._c.client_id

    @property
    def assignment(self) -> list[MessageQueue]:
        """The queues this consumer pulls now."""
        return self._on_loop(lambda: self._c.assignment)

    def poll(self, timeout_s: float = 5.0, *,
             max_messages: int | None = None) -> list[ReceivedMessage]:
        return self._loop().run(self._c.poll(timeout_s, max_messages=max_messages),
                                timeout_s + self._limit_s)

    def commit(self, offsets: dict[MessageQueue, int] | None = None) -> None:
        self._loop().run(self._c.commit(offsets), self._limit_s)

    def committed(self, mq: MessageQueue) -> int:
        return self._loop().run(self._c.committed(mq), self._limit_s)

    def seek(self, mq: MessageQueue, offset: int) -> None:
        self._loop().run(self._c.seek(mq, offset), self._limit_s)

    def seek_to_begin(self, mq: MessageQueue) -> None:
        self._loop().run(self._c.seek_to_begin(mq), self._limit_s)

    def seek_to_end(self, mq: MessageQueue) -> None:
        self._loop().run(self._c.seek_to_end(mq), self._limit_s)

    def __iter__(self) -> Iterator[ReceivedMessage]:
        """Messages one at a time, waiting across polls; ends once the consumer is closed."""
        while not self._closed:
            try:
                got = self.poll(self.ITER_POLL_S, max_messages=1)
            except ClientClosedError:
                return  # closed from another thread meanwhile
            yield from got
