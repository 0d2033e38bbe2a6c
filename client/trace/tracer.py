"""The trace writer of a tracing producer or consumer (``trace=True``): records of its sends and
consume attempts (``client.trace.records``) go into a bounded buffer and a background task writes them,
in batches, as messages to the trace topic through a producer of its own (not traced).

The user's sends and consumes never wait for it and never fail because of it: a record is
appended in O(1) without awaiting anything; when the buffer is full the record is dropped and
counted (``dropped``); a batch the brokers did not take is counted (``failed``) and not retried.
A batch goes out ``flush_s`` after its first record (the records of that window travel
together: the producer's group commit makes one request per broker group of up to
``batch_max`` of them). ``close()`` writes what is buffered, within ``close_timeout_s``.

Nothing runs until the first record: a client with tracing off has no tracer at all, and one
with tracing on starts its writer and its producer lazily.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from client import errors
from client.trace.records import CONSUME, SEND, TRACE_TOPIC, TraceRecord, trace_message
from client.types import ConsumeStatus, Listener, Message, ReceivedMessage, SendResult


class TraceProducer(Protocol):
    """What the tracer writes its records with: a producer of its own (``client.producer.producer``)."""

    async def send(self, message: Message) -> SendResult: ...

    async def close(self) -> None: ...


# Starts a producer (not traced) for the tracer's records; raises ClientError if none can start.
NewProducer = Callable[[], Awaitable[TraceProducer]]

log = logging.getLogger("client.trace.tracer")

TRACE_BUFFER_MAX = 8192  # records waiting to be written, at most (RocketMQ's queue: 2048)
TRACE_BATCH_MAX = 256  # records written at once (the producer's SEND_GROUP_MAX)
TRACE_FLUSH_S = 0.2  # a batch leaves this long after its first record
TRACE_CLOSE_S = 5.0  # close() writes what is buffered within this time, then drops the rest


class Tracer:
    def __init__(self, namesrv: Sequence[str], client_id: str, new_producer: NewProducer, *,
                 buffer_max: int = TRACE_BUFFER_MAX, batch_max: int = TRACE_BATCH_MAX,
                 flush_s: float = TRACE_FLUSH_S, send_timeout_s: float = 3.0,
                 close_timeout_s: float = TRACE_CLOSE_S) -> None:
        if buffer_max < 1 or batch_max < 1 or flush_s < 0 or close_timeout_s < 0:
            raise ValueError("buffer_max and batch_max are at least 1, the times not negative")
        self.namesrv, self.client_id = list(namesrv), client_id
        self._new_producer = new_producer
        self.buffer_max, self.batch_max, self.flush_s = buffer_max, batch_max, flush_s
        self.send_timeout_s, self.close_timeout_s = send_timeout_s, close_timeout_s
        self.written = 0  # records the brokers stored
        self.dropped = 0  # records dropped: the buffer was full, or close() ran out of time
        self.failed = 0  # records whose batch the brokers did not take
        self._buffer: collections.deque[TraceRecord] = collections.deque()
        self._more = asyncio.Event()  # (binds no loop until awaited)
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._warned = False

    def pending(self) -> list[TraceRecord]:
        """The records buffered, not yet written (oldest first)."""
        return list(self._buffer)

    # -- recording (on the client's loop; never awaits, never raises) ---------------------------

    def record(self, record: TraceRecord) -> None:
        if self._closed or record.topic == TRACE_TOPIC:  # (never a trace of a trace)
            return
        if len(self._buffer) >= self.buffer_max:
            self.dropped += 1
            return
        self._buffer.append(record)
        self._more.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def sent(self, message: Message, fut: Awaitable[SendResult], group: str) -> SendResult:
        """``fut`` (a send of ``message``) awaited, and its outcome recorded."""
        began, t0 = time.time(), time.perf_counter()
        try:
            result = await fut
        except Exception as err:  # recorded, then the caller gets it as ever
            self.record(_send_record(message, None, began, t0, type(err).__name__, group,
                                     self.client_id))
            raise
        self.record(_send_record(message, result, began, t0, result.status, group,
                                 self.client_id))
        return result

    async def sent_batch(self, messages: Sequence[Message], fut: Awaitable[list[SendResult]],
                         group: str) -> list[SendResult]:
        began, t0 = time.time(), time.perf_counter()
        try:
            results = await fut
        except Exception as err:
            for m in messages:
                self.record(_send_record(m, None, began, t0, type(err).__name__, group,
                                         self.client_id))
            raise
        for m, r in zip(messages, results):
            self.record(_send_record(m, r, began, t0, r.status, group, self.client_id))
        return results

    def sent_in_transaction(self, message: Message, result: SendResult, began: float,
                            t0: float, state: str, group: str) -> None:
        """A transactional send's record: its status ``TXN_<state>`` (COMMIT, ROLLBACK,
        UNKNOWN), where it was committed (or its half message, if it was not)."""
        self.record(_send_record(message, result, began, t0, f"TXN_{state}", group,
                                 self.client_id))

    def listener(self, listener: Listener, group: str) -> Listener:
        """``listener`` wrapped: each call's outcome and cost recorded for every message of
        its batch (an async listener's once it answers, raises or is cancelled by the consume
        timeout). What the listener returns or raises is passed on unchanged."""

        def status_of(out: object) -> str:
            return "success" if out is ConsumeStatus.SUCCESS else "later"

        async def answer(out: Awaitable[Any], batch: list[ReceivedMessage], began: float,
                         t0: float) -> Any:
            try:
                got = await out
            except BaseException:  # a timeout cancels it: recorded, then passed on
                self.consumed(batch, group, began, t0, "exception")
                raise
            self.consumed(batch, group, began, t0, status_of(got))
            return got

        def traced(batch: list[ReceivedMessage]) -> Any:
            began, t0 = time.time(), time.perf_counter()
            try:
                out = listener(batch)
            except Exception:
                self.consumed(batch, group, began, t0, "exception")
                raise
            if inspect.isawaitable(out):
                return answer(out, batch, began, t0)
            self.consumed(batch, group, began, t0, status_of(out))
            return out
        return traced

    def consumed(self, batch: Sequence[ReceivedMessage], group: str, began: float, t0: float,
                 status: str) -> None:
        cost_ms = int((time.perf_counter() - t0) * 1000)
        for m in batch:
            self.record(TraceRecord(
                CONSUME, int(began * 1000), cost_ms, status, m.topic or m.queue.topic, m.msg_id,
                m.offset_msg_id, m.queue.group, m.queue.queue_id, m.queue_offset, m.keys, m.tags,
                group, self.client_id, m.reconsume_times,
                m.queue.topic if m.queue.topic != m.topic else ""))

    # -- writing (the background task) ----------------------------------------------------------

    async def _run(self) -> None:
        producer: TraceProducer | None = None
        try:
            while self._buffer or not self._closed:
                if not self._buffer:
                    self._more.clear()
                    await self._more.wait()
                    continue
                if not self._closed:
                    await asyncio.sleep(self.flush_s)  # the batching window
                batch = [self._buffer.popleft()
                         for _ in range(min(self.batch_max, len(self._buffer)))]
                producer = producer or await self._producer(len(batch))
                if producer is not None:
                    await self._write(producer, batch)
        finally:
            if producer is not None:
                await producer.close()

    async def _producer(self, waiting: int) -> TraceProducer | None:
        try:
            return await self._new_producer()
        except errors.ClientError as err:
            self.failed += waiting
            self._warn(f"trace records not written (no NameServer answered): {err}")
            return None

    async def _write(self, producer: TraceProducer, batch: list[TraceRecord]) -> None:
        got = await asyncio.gather(*(producer.send(trace_message(r)) for r in batch),
                                   return_exceptions=True)
        errs = [g for g in got if isinstance(g, BaseException)]
        self.written += len(got) - len(errs)
        self.failed += len(errs)
        if errs:
            self._warn(f"{len(errs)} of {len(got)} trace records not written: {errs[0]}")
        else:
            self._warned = False

    def _warn(self, text: str) -> None:
        if not self._warned:  # once until a batch goes through again
            self._warned = True
            log.warning("%s", text)

    async def close(self) -> None:
        """Write what is buffered (within ``close_timeout_s``; the rest is dropped), then stop.
        Records made afterwards are ignored."""
        self._closed = True
        self._more.set()
        if self._task is None:
            return
        try:
            async with asyncio.timeout(self.close_timeout_s):
                await asyncio.shield(self._task)
        except TimeoutError:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.dropped += len(self._buffer)
        self._buffer.clear()


def _send_record(m: Message, r: SendResult | None, began: float, t0: float, status: str,
                 group: str, client_id: str) -> TraceRecord:
    cost_ms = int((time.perf_counter() - t0) * 1000)
    if r is None:
        return TraceRecord(SEND, int(began * 1000), cost_ms, status, m.topic, keys=m.keys,
                           tags=m.tags, group=group, client_id=client_id)
    return TraceRecord(SEND, int(began * 1000), cost_ms, status, m.topic, r.msg_id,
                       r.offset_msg_id, r.queue.group, r.queue.queue_id, r.queue_offset, m.keys,
                       m.tags, group, client_id)


__all__ = ["TRACE_BATCH_MAX", "TRACE_BUFFER_MAX", "Tracer"]
