"""A front end's sends to its own group that travel together (``SendGather``): the messages of
concurrent calls (gRPC SendMessage, remoting SEND_MESSAGE) go to the broker API as one SEND_RUNS
request, each message a run of its own (so each is answered, or refused, alone), and become one
log entry.

Why a front end gathers although the send path groups the sends of one event-loop turn into one
entry: a RocketMQ client's calls arrive one by one (``grpc.aio`` hands the server one call per turn,
and the client sends the next as one completes), and the leader's event loop waits out a lone
entry's fsync, so ungathered the entries stayed small, each with its own fsync and replication
round. Measured on the leader with 64 sends in flight (2 cores shared with other work; a raw gRPC
client, the official one for the last figures): ungathered 0.9-1.2 ms of the three servers' CPU per
message and 500-1,400 msgs/s; two requests under way, 1.8 messages a request, 0.7 ms; one under way,
3-4 messages a request, 0.4-0.47 ms; one under way with the linger below, 7-8 messages a request,
~0.23 ms and 3,600-4,300 msgs/s.

So one request is under way at a time (``IN_FLIGHT_MAX``), and what arrives meanwhile waits for
it to end and then travels together: no wait at all for a lone caller. When it ends, and more
sends were waiting or under way at once than wait now, the next request also waits until that
many wait (the callers just answered send their next meanwhile), but at most ``LINGER_S``.
On a follower the request is forwarded as it is: one request to the leader for the lot.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from broker.api.sendgroup import MAX_GROUP_BYTES, MAX_GROUP_MESSAGES
from protocol.broker_errors import BrokerError

__all__ = ["IN_FLIGHT_MAX", "LINGER_S", "SendGather"]

IN_FLIGHT_MAX = 1  # SEND_RUNS requests under way at once (2 or 4: smaller entries, slower)
LINGER_S = 0.005  # the longest sends wait for the callers a request just answered (see _ended)
# (SEND_RUNS' runs, deadline in seconds) -> one answer per run (the broker API's send_runs)
SendRuns = Callable[[list[list[Any]], float], Awaitable[list[Any]]]
# a waiting send: its run ([topic, queue id, [row]]), its size, and its caller's future
Pending = tuple[list[Any], int, "asyncio.Future[list[Any]]"]
Chunk = list[tuple[list[Any], "asyncio.Future[list[Any]]"]]


class SendGather:
    def __init__(self, send_runs: SendRuns, timeout_s: float,
                 in_flight_max: int = IN_FLIGHT_MAX, linger_s: float = LINGER_S) -> None:
        self.send_runs = send_runs
        self.timeout_s = timeout_s
        self.in_flight_max = in_flight_max
        self.linger_s = linger_s
        self._pending: deque[Pending] = deque()
        self._scheduled = False  # a flush is due (now, or when the linger ends)
        self._linger: asyncio.TimerHandle | None = None
        self._target = 0  # a lingering flush goes as soon as this many sends wait
        self._in_flight = 0  # sends in the requests under way
        self._peak = 0  # the most sends waiting or under way since the last request ended
        self._tasks: set[asyncio.Task[None]] = set()
        self.requests = 0  # SEND_RUNS requests made (messages / requests: how well they gather)

    def send(self, topic: str, queue_id: int, row: list[Any],
             queues_asked: int | None = None) -> asyncio.Future[list[Any]]:
        """The message's run answer, once its request is answered (``[SEND_OK, ...]`` or the
        run's ``[code, detail]``); the request's error if it failed as a whole.
        ``queues_asked``: the queue count the topic gets if this send creates it (the run's
        fourth field: ``broker.api.sendpath``)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[Any]] = loop.create_future()
        run = [topic, queue_id, [row]] if queues_asked is None else \
            [topic, queue_id, [row], queues_asked]
        self._pending.append((run, len(row[0]), fut))
        self._peak = max(self._peak, len(self._pending) + self._in_flight)
        if self._linger is not None and len(self._pending) >= self._target:
            self._linger.cancel()  # as many as were under way at once are back: no more wait
            self._linger = None
            self._scheduled = False
        if not self._scheduled and len(self._tasks) < self.in_flight_max:
            self._scheduled = True
            loop.call_soon(self._flush)  # the rest of this turn's calls travel along
        return fut

    def _flush(self) -> None:
        self._scheduled = False
        self._linger = None
        while self._pending and len(self._tasks) < self.in_flight_max:
            chunk: Chunk = []
            size = 0
            while self._pending:
                run, n, fut = self._pending[0]
                if chunk and (len(chunk) >= MAX_GROUP_MESSAGES or size + n > MAX_GROUP_BYTES):
                    break
                self._pending.popleft()
                if not fut.done():  # (its caller gave up: cancelled)
                    chunk.append((run, fut))
                    size += n
            if chunk:
                self._in_flight += len(chunk)
                task = asyncio.get_running_loop().create_task(self._request(chunk))
                self._tasks.add(task)
                task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A request was answered: the sends waiting go now, or, when more callers were under
        way at once than wait now, as soon as that many wait (at most ``linger_s`` later: the
        callers just answered send their next meanwhile)."""
        self._tasks.discard(task)
        target, self._peak = self._peak, len(self._pending) + self._in_flight
        if self._scheduled:
            return
        loop = asyncio.get_running_loop()
        target = min(target, MAX_GROUP_MESSAGES)
        if self.linger_s > 0 and target > 1 and len(self._pending) < target:
            self._scheduled, self._target = True, target
            self._linger = loop.call_later(self.linger_s, self._flush)
        elif self._pending:
            self._scheduled = True
            loop.call_soon(self._flush)

    async def _request(self, chunk: Chunk) -> None:
        self.requests += 1
        try:
            answers = await self.send_runs([run for run, _ in chunk], self.timeout_s)
            if len(answers) != len(chunk):
                raise BrokerError(f"{len(answers)} answers to {len(chunk)} runs")
        except asyncio.CancelledError:
            for _, fut in chunk:
                fut.cancel()
            raise
        except Exception as err:
            for _, fut in chunk:
                if not fut.done():
                    fut.set_exception(err)
            return
        finally:
            self._in_flight -= len(chunk)
        for (_, fut), answer in zip(chunk, answers):
            if not fut.done():
                fut.set_result(answer)

    async def close(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for _, _, fut in self._pending:
            fut.cancel()
        self._pending.clear()
