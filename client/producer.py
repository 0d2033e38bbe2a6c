"""The producer: send (returns after commit), batch, oneway; queue choice round robin over the
groups that serve the topic, with isolation of a group that failed recently; retries bounded by
the send deadline.

Retry rule: every message carries a unique key, kept across attempts. A send whose outcome is
unknown (timeout, connection lost, leadership change) is retried on the *same* group while that
group's share of the deadline lasts (its state machine stores a key once and answers a retry
with the original result); a send that certainly failed (no leader reachable, refused), or a
group that stays silent past its share, moves to another group, at most ``retries`` times. Only
in that last case can a message be stored twice (once in each group): at-least-once, as
RocketMQ. The library never configures logging, and writes no files (but a broadcasting
consumer's progress: client.offset_store).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import os
import time
from typing import Any, Callable, Sequence, TypeVar

from broker import protocol as bp
from client import errors
from client.lifecycle import Lifecycle
from client.routes import GroupRoute, Routes, client_error
from client.types import Message, MessageQueue, SendResult
from dledger.errors import DLedgerError

ISOLATE_S = 30.0  # a group that failed is skipped this long, unless no other group is left
ATTEMPT_S = 1.0  # one attempt's share of the send deadline: a silent leader is left for the others
SEND_GROUP_MAX = 256  # concurrent sends of one topic that travel as one request, at most

T = TypeVar("T")


class Producer:
    """``canaries``: seeded bugs for the chaos suite (``client.routes.CANARIES``), tests only."""

    def __init__(self, namesrv: str | Sequence[str], send_timeout_s: float = 3.0,
                 retries: int = 2, *, canaries: Sequence[str] = ()) -> None:
        self._namesrv = [namesrv] if isinstance(namesrv, str) else list(namesrv)
        self.send_timeout_s = send_timeout_s
        self.retries = retries
        self._life = Lifecycle("Producer")
        self._routes = Routes(self._namesrv, canaries=canaries)
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._isolated: dict[str, float] = {}  # group -> until (monotonic)
        self._oneway: set[asyncio.Task[Any]] = set()
        self._pending: dict[str, list[tuple[Message, asyncio.Future[SendResult]]]] = {}
        self._flush_scheduled = False
        self._in_flight: set[asyncio.Task[None]] = set()  # groups of concurrent sends

    async def start(self) -> Producer:
        """Connect (fails fast when no NameServer answers); a second start() does nothing."""
        await self._life.start(self._routes.start)
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
        await self._routes.close()

    async def __aenter__(self) -> Producer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- sending ----------------------------------------------------------------------------------

    async def send(self, message: Message) -> SendResult:
        """Store one message; returns once it is committed on a majority of its group.

        Sends of one topic made in the same turn of the event loop (concurrent coroutines) travel
        as one request, stored in one queue as one entry, and each caller gets its own result
        (or its own copy of the request's error): a client-side group commit. A lone send goes out
        at the end of its loop turn; one cancelled before then is not sent. Round robin over the
        queues advances per request, so the sends of one turn land in one queue."""
        self._life.check()
        _check_size(message)
        fut: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        pending = self._pending.get(message.topic)
        if pending is None:
            pending = self._pending[message.topic] = []
        pending.append((message, fut))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return await fut

    def _flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending = self._pending, {}
        for topic, items in pending.items():
            items = [x for x in items if not x[1].done()]  # a send cancelled before it left
            for chunk in _chunks(items, bp.MAX_BATCH_BYTES, SEND_GROUP_MAX, lambda x: len(x[0].body)):
                task = asyncio.get_running_loop().create_task(self._send_group(topic, chunk))
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)

    async def _send_group(self, topic: str, items: list[tuple[Message, asyncio.Future[SendResult]]]) -> None:
        try:
            results = await self._send_request(topic, [m for m, _ in items])
        except asyncio.CancelledError:  # the loop is closing: the callers must not hang
            for _, fut in items:
                fut.cancel()
            raise
        except Exception as err:  # noqa: BLE001 - handed to every caller of the group
            for _, fut in items:
                if not fut.done():
                    fut.set_exception(_fresh(err))
            return
        for (_, fut), result in zip(items, results):
            if not fut.done():
                fut.set_result(result)

    async def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        """Store messages of one topic; split into requests of at most 4 MiB, each stored as one
        entry (all or nothing) in one queue."""
        self._life.check()
        if not messages:
            return []
        topic = messages[0].topic
        if any(m.topic != topic for m in messages):
            raise ValueError("a batch holds messages of one topic")
        out: list[SendResult] = []
        for chunk in _chunks(messages, bp.MAX_BATCH_BYTES, len(messages), lambda m: len(m.body)):
            out.extend(await self._send_request(topic, chunk))
        return out

    def send_oneway(self, message: Message) -> None:
        """Send without waiting for (or retrying on) any answer."""
        self._life.check()
        task = asyncio.get_running_loop().create_task(self._oneway_send(message))
        self._oneway.add(task)
        task.add_done_callback(self._oneway.discard)

    async def _oneway_send(self, message: Message) -> None:
        try:
            await self._attempt(message.topic, [message], _encode([message]), retry=False)
        except errors.ClientError:
            return  # oneway: the caller asked not to know

    async def _send_request(self, topic: str, messages: Sequence[Message]) -> list[SendResult]:
        for m in messages:
            _check_size(m)
        return await self._attempt(topic, messages, _encode(messages), retry=True)

    async def _attempt(self, topic: str, messages: Sequence[Message], raw: list[Any],
                       retry: bool) -> list[SendResult]:
        assert self._routes is not None, "call start() first"
        deadline = time.monotonic() + self.send_timeout_s
        attempts = 1 + (self.retries if retry else 0)
        tried: set[str] = set()
        last: errors.ClientError | None = None
        unknown = False  # some attempt may have stored the message: never report a sure failure
        k = 0
        while k < attempts:
            try:
                route = await self._routes.route(topic, refresh=last is not None)
            except errors.UnavailableError as err:  # no group registered yet: wait a little
                last = err
                if time.monotonic() + 0.1 >= deadline:
                    break
                await asyncio.sleep(0.1)  # polling the NameServer until a group shows up
                continue
            group, queue_id = self._choose(topic, route.groups, tried)
            tried.add(group.group)
            others = any(g.group not in tried for g in route.groups)
            share = (deadline - time.monotonic()) / (attempts - k) if others else None
            k += 1
            try:
                return await self._send_to_group(group, topic, queue_id, raw, deadline, retry,
                                                 share)
            except (errors.RetriableError, errors.SendTimeoutError) as err:
                last = err  # certainly not stored, or silent past its share: try another group
                unknown = unknown or isinstance(err, errors.SendTimeoutError)
                self._routes.invalidate(topic)
                if isinstance(err, errors.StaleRouteError) or (
                        isinstance(err, errors.UnavailableError) and not others):
                    # the group is fine but our view of it is stale (or it is the only group):
                    # refresh the route and try it again, without isolating it
                    k -= 1
                    tried.discard(group.group)
                    if time.monotonic() + 0.1 >= deadline:
                        break
                    await asyncio.sleep(0.1)  # polling the NameServer for the group's new view
                    continue
                self._isolated[group.group] = time.monotonic() + ISOLATE_S
                if isinstance(err, errors.SendTimeoutError) and not others:
                    raise
            if time.monotonic() >= deadline:
                break
        if unknown and not isinstance(last, errors.SendTimeoutError):
            raise errors.SendTimeoutError(f"send to {topic!r}: an earlier attempt's outcome is "
                                          f"unknown; the last one failed: {last}") from last
        raise last or errors.UnavailableError(f"no group took the send to {topic!r}")

    async def _send_to_group(self, group: GroupRoute, topic: str, queue_id: int, raw: list[Any],
                             deadline: float, retry: bool, share_s: float | None) -> list[SendResult]:
        assert self._routes is not None
        client = self._routes.group_client(group)
        if share_s is not None:
            deadline = min(deadline, time.monotonic() + share_s)
        unknown = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise errors.SendTimeoutError(f"send to {topic!r} not known to be committed in time")
            try:
                node, res = await client.call_leader(bp.SEND, topic, queue_id, raw,
                                                     timeout_s=min(remaining, ATTEMPT_S) if retry
                                                     else remaining)
            except DLedgerError as err:
                mapped = client_error(err)
                if isinstance(mapped, errors.SendTimeoutError) and retry:
                    unknown = True
                    continue  # outcome unknown: the same group dedups the unique keys
                if unknown and isinstance(mapped, errors.RetriableError) \
                        and not isinstance(mapped, errors.StaleRouteError):
                    # an earlier attempt may be stored: only this group can tell (it dedups the
                    # key), so keep asking it, through its election, until the deadline
                    await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                    continue
                if unknown and not isinstance(mapped, errors.SendTimeoutError):
                    raise errors.SendTimeoutError(
                        f"send to {topic!r}: outcome unknown, then {mapped}") from err
                raise mapped from err
            return _results(topic, group.group, res, raw, node)

    def _choose(self, topic: str, groups: Sequence[GroupRoute], tried: set[str]) -> tuple[GroupRoute, int]:
        now = time.monotonic()
        queues = [(g, q) for g in groups if g.perm & 2 for q in range(g.write_queues)]
        if not queues:
            raise errors.NoPermissionError(f"no group accepts writes to {topic!r}")
        fresh = [x for x in queues if x[0].group not in tried
                 and self._isolated.get(x[0].group, 0) <= now]
        pool = fresh or [x for x in queues if x[0].group not in tried] or queues
        counter = self._round_robin.setdefault(topic, itertools.count())
        return pool[next(counter) % len(pool)]


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


def _results(topic: str, group: str, res: list[Any], raw: list[Any],
             node: str = "") -> list[SendResult]:
    status, _, offsets, offset_ids, dups, queue_ids = res
    queues: dict[int, MessageQueue] = {}  # one object per queue, not per message
    out = []
    for k in range(len(raw)):
        mq = queues.get(queue_ids[k])
        if mq is None:
            mq = queues[queue_ids[k]] = MessageQueue(topic, group, queue_ids[k])
        out.append(SendResult(status, raw[k][3], offset_ids[k], mq, offsets[k], dups[k], node))
    return out


def _fresh(err: Exception) -> Exception:
    """A copy of ``err`` for one more caller (one instance raised in many tasks tangles their
    tracebacks); ``err`` itself when it cannot be copied."""
    try:
        twin = copy.copy(err)
    except Exception:  # noqa: BLE001 - an exception type that does not copy: share it
        return err
    if str(twin) != str(err) or vars(twin) != vars(err):
        return err  # its constructor takes other arguments than its args: share it
    twin.__cause__ = err.__cause__
    return twin


def _check_size(m: Message) -> None:  # before anything is sent: nothing of the call is stored
    if len(m.body) > bp.MAX_MESSAGE_BYTES:
        raise errors.MessageTooLargeError(f"message of {len(m.body)} bytes exceeds "
                                          f"{bp.MAX_MESSAGE_BYTES}")


def _chunks(items: Sequence[T], max_bytes: int, max_items: int, size: Callable[[T], int]) -> list[list[T]]:
    """Consecutive runs of ``items`` of at most ``max_bytes`` (by ``size``) and ``max_items``."""
    out: list[list[T]] = []
    total = 0
    for x in items:
        n = size(x)
        if not out or total + n > max_bytes or len(out[-1]) >= max_items:
            out.append([])
            total = 0
        out[-1].append(x)
        total += n
    return out
