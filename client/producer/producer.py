"""The producer: send (returns after commit), batch, oneway. Each message's queue is chosen on its
own, round robin over the writable queues of the groups that serve its topic (as RocketMQ's
producer does), with isolation of a group that failed recently; retries bounded by the send
deadline.

Retry rule: every message carries a unique key, kept across attempts. A send whose outcome is
unknown (timeout, connection lost, leadership change) is retried on the *same* group while that
group's share of the deadline lasts (its state machine stores a key once and answers a retry
with the original result); a send that certainly failed (no leader reachable, refused, a topic
read-only on that group although the route said writable), or a group that stays silent past its
share, moves to another group, at most ``retries`` times: the messages that failed together
choose their queues again, away from the groups they tried. Only in that last case can a
message be stored twice (once in each group): at-least-once, as RocketMQ. The rule is the same
for a send awaited, run as a task with a callback (RocketMQ's async send) or made through the
blocking twin (docs/client.md says why RocketMQ's separate async rule is not kept). The
library never configures logging, and writes no files (but a broadcasting consumer's progress:
client.consumer.offset_store).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from client import errors
from client.cluster.routes import DEFAULT_QUEUES, Routes
from client.lifecycle import Lifecycle
from client.producer.batch import message_bytes
from client.producer.delivery import Attempt, Delivery, Sends, chunks
from client.producer.group import ProducerRegistration, new_client_id
from client.trace.tracer import NewProducer, Tracer
from client.types import Message, MessageQueue, SendResult
from protocol import broker_kinds as bp
from protocol.auth import Credentials
from protocol.consume_rules import MESSAGE_GROUP_PROPERTY
from protocol.topics import MAX_QUEUES

TRACE_SEND_TIMEOUT_S = 3.0  # a tracer's own producer's sends

QueueSelector = Callable[[list[MessageQueue], Message, str], MessageQueue]


def hash_selector(queues: list[MessageQueue], message: Message, key: str) -> MessageQueue:
    """RocketMQ's SelectMessageQueueByHash, with a hash that is the same in every process."""
    return queues[zlib.crc32(key.encode()) % len(queues)]

UNIQUE_KEY_MAX_CHARS = 255
SEND_GROUP_MAX = 256  # concurrent sends that travel together (one request per group), at most
SEND_GROUP_BYTES = 4 << 20  # ... and their bodies' bytes, at most


class Producer:
    """``trace``: write a trace record of each send (``send``, ``send_to``, ``send_orderly``,
    ``send_batch``; not ``send_oneway``) to the trace topic, in the background
    (``client.trace.tracer``; ``tracer`` then holds its counts). ``canaries``: seeded bugs for the
    chaos suite (``client.cluster.routes.CANARIES``), tests only. ``tls_ca``: the CA file of a cluster
    that speaks TLS (else ``DLEDGER_TLS_CA``; ``client.cluster.routes.Routes``).
    ``default_topic_queue_nums`` (RocketMQ's setDefaultTopicQueueNums): the queues a topic this
    producer's send creates gets, 1..1024 (the broker creates at most its own ``--default-queues``;
    None: the broker's default). ``max_message_size_bytes`` (setMaxMessageSize): a message, or a
    batch, larger than this is refused before it is sent (``MessageTooLargeError``); the broker
    still refuses what exceeds its own ``--max-message-bytes``."""

    def __init__(self, namesrv: str | Sequence[str], send_timeout_s: float = 3.0,
                 retries: int = 2, *, group: str | None = None, client_id: str | None = None,
                 trace: bool = False, canaries: Sequence[str] = (),
                 credentials: Credentials | None = None, tls_ca: str | None = None,
                 default_topic_queue_nums: int | None = None,
                 max_message_size_bytes: int = bp.MAX_MESSAGE_BYTES_CEILING) -> None:
        if default_topic_queue_nums is not None and (
                type(default_topic_queue_nums) is not int or not 1 <= default_topic_queue_nums <= MAX_QUEUES):
            raise ValueError(f"default_topic_queue_nums is 1..{MAX_QUEUES} (or None: the "
                             f"broker's default), not {default_topic_queue_nums!r}")
        if type(max_message_size_bytes) is not int \
                or not 1 <= max_message_size_bytes <= bp.MAX_MESSAGE_BYTES_CEILING:
            raise ValueError(f"max_message_size_bytes is 1..{bp.MAX_MESSAGE_BYTES_CEILING}, not "
                             f"{max_message_size_bytes!r}")
        self.max_message_size_bytes = max_message_size_bytes
        self._namesrv = [namesrv] if isinstance(namesrv, str) else list(namesrv)
        self.group = group  # a producer group (RocketMQ's DefaultMQProducer("pg")): listed by
        self.client_id = client_id or new_client_id()  # the brokers (dledger producer list)
        self.send_timeout_s = send_timeout_s
        self.retries = retries
        self._life = Lifecycle("Producer")
        self._routes = Routes(self._namesrv, canaries=canaries, credentials=credentials,
                              tls_ca=tls_ca, new_topic_queues=default_topic_queue_nums or DEFAULT_QUEUES)
        self._delivery = Delivery(self._routes, default_topic_queue_nums)
        self._oneway: set[asyncio.Task[Any]] = set()
        self._pending: list[tuple[Message, asyncio.Future[SendResult]]] = []
        self._flush_scheduled = False
        self._in_flight: set[asyncio.Task[None]] = set()  # groups of concurrent sends
        self._registration = ProducerRegistration(self._routes, group, self.client_id) \
            if group is not None else None
        self.tracer = Tracer(self._namesrv, self.client_id, trace_producer(self._namesrv)) \
            if trace else None

    async def start(self) -> Producer:
        """Connect (fails fast when no NameServer answers); a second start() does nothing."""
        async def work() -> None:
            await self._routes.start()
            if self._registration is not None:
                await self._registration.start()
        await self._life.start(work)
        return self

    async def close(self) -> None:
        """Finish the sends under way, then release the connections; later sends raise
        ``ClientClosedError``."""
        if not self._life.close():
            return
        if self._pending:
            self._flush()
        if self._oneway or self._in_flight:
            await asyncio.gather(*self._oneway, *self._in_flight, return_exceptions=True)
        if self._registration is not None:
            await self._registration.stop()
        await self._routes.close()
        if self.tracer is not None:
            await self.tracer.close()  # (the sends' records are in: they have all ended)

    async def __aenter__(self) -> Producer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- sending ----------------------------------------------------------------------------------

    async def send(self, message: Message) -> SendResult:
        """Store one message; returns once it is committed on a majority of its group.

        Sends made in the same turn of the event loop (concurrent coroutines) travel together:
        each message gets its own queue (round robin over its topic's writable queues), and the
        messages bound for one group go as one request, which the group's leader stores as one
        entry with one run per queue; each caller gets its own result (or its own copy of an
        error). A client-side group commit that still spreads messages over queues. A lone send
        goes out at the end of its loop turn; one cancelled before then is not sent."""
        self._life.check()
        _check_size(message, self.max_message_size_bytes)
        fut: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        self._pending.append((message, fut))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        if self.tracer is not None:
            return await self.tracer.sent(message, fut, self.group or "")
        return await fut

    def _flush(self) -> None:
        self._flush_scheduled = False
        items = [x for x in self._pending if not x[1].done()]  # a send cancelled before it left
        self._pending = []
        delayed = [x for x in items if x[0].properties and x[0].delayed]
        if delayed:  # a broker takes a run of delayed messages or of immediate ones, not both
            items = [x for x in items if not (x[0].properties and x[0].delayed)]
        for chunk in [*chunks(items, SEND_GROUP_BYTES, SEND_GROUP_MAX, lambda x: len(x[0].body)),
                      *chunks(delayed, SEND_GROUP_BYTES, SEND_GROUP_MAX, lambda x: len(x[0].body))]:
            sends = Sends([m.topic for m, _ in chunk], _encode([m for m, _ in chunk]),
                          [f for _, f in chunk])
            self._run(sends, retry=True, tasks=self._in_flight)

    def _run(self, sends: Sends, retry: bool, tasks: set[asyncio.Task[Any]]) -> asyncio.Task[None]:
        attempt = Attempt(time.monotonic() + self.send_timeout_s, 1 + (self.retries if retry else 0))
        task = asyncio.get_running_loop().create_task(self._deliver(sends, attempt, retry))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    async def _deliver(self, sends: Sends, attempt: Attempt, retry: bool) -> None:
        try:
            await self._delivery.deliver(sends, list(range(len(sends.topics))), attempt, retry)
        except asyncio.CancelledError:  # the loop is closing: the callers must not hang
            sends.cancel()
            raise
        except Exception as err:  # handed to every caller still waiting
            sends.fail_all(err)

    async def queues(self, topic: str) -> list[MessageQueue]:
        """The writable queues of ``topic`` over its groups, in a stable order (what a queue
        selector chooses from)."""
        self._life.check()
        route = await self._routes.route(topic, refresh=True)
        return sorted(MessageQueue(topic, g.group, q) for g in route.groups if g.perm & 2
                      for q in range(g.write_queues))

    async def send_to(self, message: Message, queue: MessageQueue) -> SendResult:
        """Store one message in ``queue``; retried there only (RocketMQ's ordered send)."""
        self._life.check()
        _check_size(message, self.max_message_size_bytes)
        if message.topic != queue.topic:
            raise ValueError(f"the message's topic {message.topic!r} is not {queue.topic!r}'s")
        sent = self._delivery.to_queue(_encode([message]), queue,
                                       time.monotonic() + self.send_timeout_s)
        if self.tracer is not None:
            return await self.tracer.sent(message, sent, self.group or "")
        return await sent

    async def send_keyed(self, message: Message, unique_key: str) -> SendResult:
        """Store ``message`` under a unique key of the caller's (the key a send is deduplicated
        by): a broker group stores one message per key, content and topic within its dedup
        window (10 minutes by default) and answers a repeat (the same message under the same
        key) with the original's result, however many times and from however many processes it
        is sent; another message under the key is stored as well. The queue is chosen by the key's hash
        (the same in every process, while the topic's queues stay the same), so a repeat goes
        to the group that has the original. Used by cross-group pipelines
        (``client.producer.pipeline``)."""
        if type(unique_key) is not str or not 0 < len(unique_key) <= UNIQUE_KEY_MAX_CHARS:
            raise ValueError(f"a unique key has 1..{UNIQUE_KEY_MAX_CHARS} characters")
        queues = await self.queues(message.topic)
        if not queues:
            raise errors.TopicNotFoundError(f"no group takes writes to {message.topic!r}")
        raw = _encode([message])
        raw[0][3] = unique_key
        return await self._delivery.to_queue(raw, hash_selector(queues, message, unique_key),
                                             time.monotonic() + self.send_timeout_s)

    async def send_orderly(self, message: Message, sharding_key: str,
                           selector: QueueSelector | None = None) -> SendResult:
        """Store ``message`` in the queue its ``sharding_key`` selects (by default the key's
        CRC32 modulo the queue count, the same in every process), so that one key's messages
        are stored in one queue in the order they were sent (await each send before the next
        of the same key: RocketMQ's rule for ordered sends). A topic with one queue gives a
        global order. ``selector(queues, message, sharding_key)`` chooses otherwise.

        The key is stored as the message's group (``__SHARDINGKEY``, unless the message names
        one already), as a RocketMQ 5 FIFO message's: consumers at the gRPC endpoint get one
        key's messages one at a time, in order, and different keys of a queue in parallel.
        Our orderly push consumer orders by queue, whatever the group."""
        queues = await self.queues(message.topic)
        if not queues:
            raise errors.TopicNotFoundError(f"no group takes writes to {message.topic!r}")
        if sharding_key and not any(n == MESSAGE_GROUP_PROPERTY for n, _ in message.properties):
            message = Message(message.topic, message.body, message.tags, message.keys,
                              (*message.properties, (MESSAGE_GROUP_PROPERTY, sharding_key)))
        choose = selector or hash_selector
        return await self.send_to(message, choose(queues, message, sharding_key))

    async def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        """Store messages of one topic as one entry in one queue, all or nothing (RocketMQ's
        batch). A batch larger than the broker's maximum (4 MiB by default, counted as
        ``client.message_bytes`` counts) is refused with ``MessageTooLargeError`` and nothing
        is stored; ``client.split_batch`` cuts a long list into batches that fit."""
        self._life.check()
        if not messages:
            return []
        topic = messages[0].topic
        if any(m.topic != topic for m in messages):
            raise ValueError("a batch holds messages of one topic")
        total = sum(message_bytes(m) for m in messages)
        if total > self.max_message_size_bytes:  # refused before sending
            raise errors.MessageTooLargeError(
                f"batch of {total} bytes exceeds the producer's maximum of "
                f"{self.max_message_size_bytes} bytes (max_message_size_bytes)")
        fut: asyncio.Future[list[SendResult]] = asyncio.get_running_loop().create_future()
        self._run(Sends([topic], [_encode(messages)], batch=fut), retry=True, tasks=self._in_flight)
        if self.tracer is not None:
            return await self.tracer.sent_batch(messages, fut, self.group or "")
        return await fut

    def send_oneway(self, message: Message) -> None:
        """Send without waiting for (or retrying on) any answer."""
        self._life.check()
        _check_size(message, self.max_message_size_bytes)
        self._run(Sends([message.topic], _encode([message]), None), retry=False,
                  tasks=self._oneway)


class _UniqueKeys:
    """RocketMQ-style unique keys (UNIQ_KEY): 32 hex digits, a random 64-bit prefix drawn once
    per process (and again in a forked child) followed by a 64-bit counter. Unique without a
    system call per message, which uuid4 makes."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._prefix = os.urandom(8).hex().upper()
        self._counter = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter):016X}"


_unique_keys = _UniqueKeys()


def _encode(messages: Sequence[Message]) -> list[Any]:
    born_ms = int(time.time() * 1000)
    key = _unique_keys.next
    return [[m.body, m.tags, list(m.keys) if m.keys else [], key(),
             [list(p) for p in m.properties] if m.properties else [], born_ms] for m in messages]


def _check_size(m: Message, max_bytes: int = bp.MAX_MESSAGE_BYTES_CEILING) -> None:
    """Before anything is sent: a message larger than the producer's maximum (by default the
    protocol's ceiling, which no broker exceeds). A broker's own maximum (4 MiB by default) is
    its to enforce: it may be larger."""
    n = message_bytes(m)
    if n > max_bytes:
        raise errors.MessageTooLargeError(f"message of {n} bytes exceeds the producer's maximum "
                                          f"of {max_bytes} bytes (max_message_size_bytes)")


def trace_producer(namesrv: Sequence[str]) -> NewProducer:
    """How a tracer starts its own producer (not traced) when its first batch goes out."""
    async def start() -> Producer:
        return await Producer(list(namesrv), TRACE_SEND_TIMEOUT_S, retries=1).start()
    return start
