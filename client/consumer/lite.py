"""The lite pull consumer (RocketMQ's ``DefaultLitePullConsumer``): the caller polls, the consumer
pulls. One background puller per assigned queue long-polls the broker into a bounded buffer of
that queue (``buffer_max`` messages, RocketMQ's ``pullThresholdForQueue``, 1000; a full buffer
makes its puller wait: back-pressure); ``poll()`` returns up to ``poll_batch_max`` buffered
messages (10, as RocketMQ's lite ``pullBatchSize``), taken from the queues round-robin, and
``async for message in consumer`` one at a time. ``pull_batch_max`` (32) is the most one pull
asks the broker for.

Assignment, one of:

- ``subscribe(topic, tags)``: the group shares the topics' queues (clustering), as the push
  consumer does: heartbeats to every node of the topics every ``heartbeat_s``, a rebalance at once
  when the group's members or the topics' routes change (``client.consumer.watch``) and every
  ``rebalance_s``, with a ``client.consumer.rebalance`` strategy. A queue
  given away is committed (with ``auto_commit``) and its buffer dropped; a queue taken starts
  from the group's committed offset (after a hand-over wait of ``2 * heartbeat_s + 1`` s when
  the group has other members, for its last owner to commit), or else from ``start_from``
  ("last", "first", "timestamp" with ``start_timestamp_ms``; a queue that appeared while the
  consumer ran starts at its first message).
- ``assign(queues)``: exactly these queues, no group membership and no rebalance; each starts
  from the group's committed offset, or else from ``start_from``.

Progress: what poll returned counts as consumed (RocketMQ's lite consumer: the offset moves at
poll). With ``auto_commit`` the polled progress of every queue is committed every
``auto_commit_interval_s``, when a queue is given away and at ``close()``; without it, only
``commit()`` commits. Nothing ever commits past what poll returned, so messages buffered but
not polled come again to the next owner. ``seek`` repositions a queue (its buffer is dropped;
the new position is what a commit then stores, as RocketMQ's seek).

No retries: unlike the push consumer there is no listener to fail, so this consumer does not
read ``%RETRY%<group>`` and sends nothing back (nor does RocketMQ's lite pull consumer); what
the caller cannot handle it must handle itself (seek back, or not commit).

Tags filter as the push consumer's (``"A || B"``, ``"*"``); ``sql=`` subscribes with a SQL92
expression (``protocol.filter_sql``) instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from client import checks, errors
from client.consumer import membership
from client.consumer.lite_buffer import QueueBuffers
from client.consumer.pull import PullConsumer
from client.consumer.rebalance import Strategy, strategy_of
from client.consumer.watch import GroupWatch
from client.errors import compile_filter
from client.identity import new_client_id
from client.lifecycle import CLOSED, NEW, Lifecycle
from client.producer.producer import trace_producer
from client.trace.tracer import Tracer
from client.types import MessageQueue, PullResult, ReceivedMessage
from protocol import broker_kinds as bp
from protocol.auth import Credentials

log = logging.getLogger("client.consumer.lite")

RETRY_S = 0.2  # the back-off of a puller after an error
LAG_RETRY_S = 0.05  # ... after a replica that lags behind the offset asked for
EMPTY_RETRY_S = 0.1  # ... after an empty answer when the broker does not hold pulls (suspend 0)
BUFFER_MAX_LIMIT = 65_535  # RocketMQ's range of pullThresholdForQueue


class LitePullConsumer:
    def __init__(self, namesrv: str | Sequence[str], group: str, *, pull_batch_max: int = 32,
                 poll_batch_max: int = 10, auto_commit: bool = True,
                 auto_commit_interval_s: float = 5.0, start_from: str = "last",
                 start_timestamp_ms: int | None = None, client_id: str | None = None,
                 heartbeat_s: float = 5.0, rebalance_s: float = 20.0,
                 strategy: str | Strategy = "averagely", suspend_ms: int = 1000, buffer_max: int = 1000,
                 timeout_s: float = 3.0, trace: bool = False,
                 credentials: Credentials | None = None) -> None:
        self._credentials = credentials
        checks.text("group", group)
        checks.number("pull_batch_max", pull_batch_max, 1, bp.MAX_PULL_MESSAGES, integer=True)
        checks.number("poll_batch_max", poll_batch_max, 1, bp.MAX_PULL_MESSAGES, integer=True)
        checks.number("buffer_max", buffer_max, 1, BUFFER_MAX_LIMIT, integer=True)
        checks.number("suspend_ms", suspend_ms, 0, bp.MAX_SUSPEND_MS, integer=True)
        for name, value in (("auto_commit_interval_s", auto_commit_interval_s),
                            ("heartbeat_s", heartbeat_s), ("rebalance_s", rebalance_s),
                            ("timeout_s", timeout_s)):
            checks.number(name, value, 0.001)
        checks.flag("auto_commit", auto_commit)
        membership.check_start(start_from, start_timestamp_ms)
        if client_id is not None:
            checks.text("client_id", client_id)
        self.group, self.client_id = group, client_id or new_client_id()
        self.pull_batch_max, self.poll_batch_max = pull_batch_max, poll_batch_max
        self.auto_commit, self.auto_commit_interval_s = auto_commit, auto_commit_interval_s
        self.start_from, self.start_timestamp_ms = start_from, start_timestamp_ms
        self.heartbeat_s, self.rebalance_s, self.suspend_ms = heartbeat_s, rebalance_s, suspend_ms
        self.strategy = strategy_of(strategy)
        self.handover_s = 2 * heartbeat_s + 1.0
        self._namesrv, self.timeout_s = namesrv, timeout_s
        self._pull = PullConsumer(namesrv, group, timeout_s, credentials=credentials)
        self._life = Lifecycle(f"LitePullConsumer of group {group!r}")
        self._buffers = QueueBuffers(buffer_max)
        self._subs: dict[str, str] = {}  # topic -> tag expression
        self._sql: dict[str, str] = {}  # topic -> SQL92 expression, for those subscribed so
        self._assigned: set[MessageQueue] | None = None  # assign() mode
        self._initial: set[MessageQueue] | None = None  # the queues seen at start (subscribe)
        self._pullers: dict[MessageQueue, asyncio.Task[None]] = {}
        self._room: dict[MessageQueue, asyncio.Event] = {}
        self._arrived = asyncio.Event()  # (binds no loop until awaited)
        self._changed = asyncio.Event()
        self._watch = self._new_watch()  # members, routes, subscriptions (subscribe mode)
        self._tasks: list[asyncio.Task[None]] = []
        self._retired: set[asyncio.Task[None]] = set()  # cancelled by a seek, finishing
        # trace: a record of each message polled (a success, cost 0) to the trace topic
        names = [namesrv] if isinstance(namesrv, str) else namesrv
        self.tracer = Tracer(names, self.client_id, trace_producer(names)) if trace else None

    # -- configuration --------------------------------------------------------------------------

    def subscribe(self, topic: str, tags: str | None = "*", *, sql: str | None = None) -> None:
        """Before start(): the group shares ``topic``'s queues; messages whose tag is in ``tags``
        (``A || B``, ``*``), or that match the SQL92 expression ``sql`` (checked now:
        ``BadFilterError``; then ``tags`` stays ``*``). Exclusive with ``assign``."""
        if self._assigned is not None:
            raise ValueError("subscribe() and assign() are exclusive: this consumer is assigned")
        if self._life.state != NEW:
            raise ValueError("subscribe() before start()")
        checks.text("topic", topic)
        expression = membership.tag_expression(tags)
        self._sql.pop(topic, None)
        if sql is not None:
            if expression != "*":
                raise ValueError("subscribe with tags or with sql, not both")
            compile_filter(sql)  # BadFilterError now, not in a puller later
            self._sql[topic] = expression = sql  # (heartbeats tell the SQL, as the push's)
        self._subs[topic] = expression

    def assign(self, queues: Sequence[MessageQueue]) -> None:
        """Consume exactly ``queues`` (no group rebalance); before or after start(): a queue no
        longer listed is committed (with ``auto_commit``) and dropped. Exclusive with
        ``subscribe``."""
        if self._subs:
            raise ValueError("subscribe() and assign() are exclusive: this consumer subscribed")
        if self._life.state == CLOSED:
            raise errors.ClientClosedError(f"{self._life.what} is closed")
        wanted = list(queues)
        if not all(isinstance(q, MessageQueue) for q in wanted):
            raise ValueError(f"assign() takes MessageQueues, not {wanted!r}")
        self._assigned = set(wanted)
        self._changed.set()  # (started: the rebalance loop applies it at once)

    @property
    def assignment(self) -> list[MessageQueue]:
        """The queues this consumer pulls now."""
        return self._buffers.queues()

    @property
    def members(self) -> list[str]:
        """The group's live members, as the last heartbeat (or notice) told ([]: assigned)."""
        return self._watch.members

    def _new_watch(self) -> GroupWatch:
        return GroupWatch(self._pull, self.client_id, self.group, self._subs, "clustering",
                          self.heartbeat_s, self._changed)

    # -- life -----------------------------------------------------------------------------------

    async def start(self) -> LitePullConsumer:
        """Join the group (subscribe) or take the assigned queues, and start pulling; fails fast
        when no NameServer answers. A second start() does nothing."""
        if not self._subs and self._assigned is None:
            raise ValueError("subscribe() to a topic or assign() queues before start()")
        await self._life.start(self._start)
        return self

    async def _start(self) -> None:
        try:
            await self._pull.start()
            if self._subs:
                for topic in self._subs:  # a topic created a moment ago: wait for its route
                    try:
                        await self._pull.fetch_queues(topic)
                    except errors.TopicNotFoundError:
                        continue  # not there yet: a later rebalance picks it up
                await self._watch.heartbeat()
            seen = await self._rebalance()
            self._initial = seen if self._subs else None
        except BaseException:  # leave nothing open behind a failed start (it may be retried)
            await self._stop_pullers()
            self._pullers.clear()
            self._room.clear()
            self._buffers = QueueBuffers(self._buffers.buffer_max)
            await self._pull.close()
            self._pull = PullConsumer(self._namesrv, self.group, self.timeout_s,
                                      credentials=self._credentials)
            self._watch = self._new_watch()
            raise
        loops = [self._rebalance_loop()]
        loops += [self._watch.heartbeats(), self._watch.routes()] if self._subs else []
        loops += [self._commit_loop()] if self.auto_commit else []
        self._tasks = [asyncio.create_task(c) for c in loops]

    async def close(self) -> None:
        """Stop pulling; with ``auto_commit``, commit what was polled; leave the group. A poll
        waiting meanwhile returns [], an ``async for`` ends."""
        if not self._life.close():
            return
        self._arrived.set()  # wake the polls waiting: they see the consumer closed
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._stop_pullers()
        if self.auto_commit:
            await self._commit_due(raise_errors=False)
        if self._subs:
            await self._watch.heartbeat(leave=True)
        await self._pull.close()
        if self.tracer is not None:
            await self.tracer.close()

    async def __aenter__(self) -> LitePullConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _stop_pullers(self) -> None:
        tasks = [*self._pullers.values(), *self._retired]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- polling --------------------------------------------------------------------------------

    async def poll(self, timeout_s: float = 5.0, *,
                   max_messages: int | None = None) -> list[ReceivedMessage]:
        """Up to ``max_messages`` (default ``poll_batch_max``) buffered messages, waiting up to
        ``timeout_s`` for the first; [] after the timeout, or once the consumer is closed."""
        self._life.check()
        checks.number("timeout_s", timeout_s, 0)
        n = self.poll_batch_max if max_messages is None else max_messages
        checks.number("max_messages", n, 1, None, integer=True)
        return await self._take(n, timeout_s)

    async def _take(self, n: int, timeout_s: float) -> list[ReceivedMessage]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._life.state != CLOSED:
            self._arrived.clear()
            got = self._buffers.take(n)
            if got:
                if self.tracer is not None:
                    self.tracer.consumed(got, self.group, time.time(), time.perf_counter(),
                                         "success")
                for mq in {m.queue for m in got}:
                    if mq in self._room:
                        self._room[mq].set()  # its puller may go on
                return got
            if loop.time() >= deadline:
                break
            try:
                async with asyncio.timeout(deadline - loop.time()):
                    await self._arrived.wait()
            except TimeoutError:
                break
        return []

    def __aiter__(self) -> LitePullConsumer:
        return self

    async def __anext__(self) -> ReceivedMessage:
        """The next message (one at a time: a commit never counts one not yet yielded)."""
        while self._life.state != CLOSED:
            self._life.check()
            got = await self._take(1, 60.0)
            if got:
                return got[0]
        raise StopAsyncIteration

    # -- offsets --------------------------------------------------------------------------------

    async def commit(self, offsets: dict[MessageQueue, int] | None = None) -> None:
        """Commit ``offsets`` (each the next offset to consume of its queue), or with None what
        poll returned so far on every assigned queue (where it moved since the last commit)."""
        self._life.check()
        if offsets is None:
            await self._commit_due(raise_errors=True)
            return
        for mq, offset in offsets.items():
            if not isinstance(mq, MessageQueue):
                raise ValueError(f"commit() takes MessageQueue keys, not {mq!r}")
            checks.number(f"the offset of {mq}", offset, 0, None, integer=True)
        await self._commit_each(dict(offsets), raise_errors=True)

    async def _commit_due(self, raise_errors: bool) -> None:
        await self._commit_each(self._buffers.due(), raise_errors)

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.auto_commit_interval_s)  # the auto-commit period
            await self._commit_due(raise_errors=False)

    async def _commit_each(self, offsets: dict[MessageQueue, int], raise_errors: bool) -> None:
        got = await asyncio.gather(*(self._pull.commit(mq, o) for mq, o in offsets.items()),
                                   return_exceptions=True)
        failed: list[BaseException] = []
        for (mq, offset), outcome in zip(offsets.items(), got):
            if isinstance(outcome, BaseException):
                failed.append(outcome)
                log.warning("commit %s at %d: %s", mq, offset, outcome)
            else:
                self._buffers.committed(mq, offset)
        if failed and raise_errors:
            raise failed[0]

    async def committed(self, mq: MessageQueue) -> int:
        """The group's committed offset on ``mq`` (-1: none), as its leader has it."""
        self._life.check()
        return await self._pull.committed(mq)

    async def seek(self, mq: MessageQueue, offset: int) -> None:
        """The next polls of ``mq`` (an assigned queue) start at ``offset``, between the queue's
        first and last offsets; its buffered messages are dropped."""
        lo, hi = await self._bounds(mq)
        checks.number(f"the offset to seek {mq} to", offset, lo, hi, integer=True)
        self._reposition(mq, offset)

    async def seek_to_begin(self, mq: MessageQueue) -> None:
        """``seek`` to the first offset the queue still holds."""
        self._reposition(mq, (await self._bounds(mq))[0])

    async def seek_to_end(self, mq: MessageQueue) -> None:
        """``seek`` past the last message: only messages sent from now on are polled."""
        self._reposition(mq, (await self._bounds(mq))[1])

    async def _bounds(self, mq: MessageQueue) -> tuple[int, int]:
        self._life.check()
        self._check_assigned(mq)
        res = await self._pull.pull(mq, 0, 0)
        return res.min_offset, res.max_offset

    def _check_assigned(self, mq: MessageQueue) -> None:
        if mq not in self._buffers:
            raise ValueError(f"{mq} is not assigned to this consumer (assignment: "
                             f"{self.assignment})")

    def _reposition(self, mq: MessageQueue, offset: int) -> None:
        self._check_assigned(mq)  # (again: a rebalance may have taken it during the await)
        old = self._pullers.pop(mq)
        old.cancel()  # its pull in flight, if any, cannot land: the epoch moved
        self._retired.add(old)
        old.add_done_callback(self._retired.discard)
        self._buffers.reset(mq, offset)
        self._pullers[mq] = asyncio.create_task(self._puller(mq))

    # -- membership and assignment --------------------------------------------------------------

    async def _rebalance(self) -> set[MessageQueue]:
        """Bring the pulled queues to what they should be; returns the queues seen."""
        if self._assigned is not None:
            wanted, seen = set(self._assigned), set(self._assigned)
        else:
            wanted, seen = await membership.share(self._pull, self.client_id, self.members,
                                                  sorted(self._subs), self.strategy)
            for topic in self._subs:  # (a change of a topic's queues: the watch reads it closely)
                self._watch.saw(topic, [q for q in seen if q.topic == topic])
        for mq in [q for q in self._buffers.queues() if q not in wanted]:
            await self._drop(mq)
        for mq in sorted(wanted - set(self._buffers.queues())):
            self._buffers.add(mq)
            self._room[mq] = asyncio.Event()
            self._pullers[mq] = asyncio.create_task(self._puller(mq))
        return seen

    async def _rebalance_loop(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.rebalance_s):  # (not wait_for: see client.consumer.listening)
                    await self._changed.wait()
            except TimeoutError:
                pass  # the periodic rebalance (queues added to a topic)
            self._changed.clear()
            try:
                await self._rebalance()
            except errors.ClientError as err:
                log.warning("rebalance of %s failed: %s", self.group, err)

    async def _drop(self, mq: MessageQueue) -> None:
        """Give a queue away: forget its buffer (polls no longer see it), stop its puller, then
        commit what was polled (with auto_commit): the next owner pulls from there."""
        due = self._buffers.due().get(mq)
        self._buffers.remove(mq)
        del self._room[mq]
        task = self._pullers.pop(mq)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if self.auto_commit and due is not None:
            await self._commit_each({mq: due}, raise_errors=False)

    # -- pulling --------------------------------------------------------------------------------

    async def _start_offset(self, mq: MessageQueue) -> int:
        if self._subs and len(self.members) > 1:
            await asyncio.sleep(self.handover_s)  # the queue's last owner commits first
        start = await self._pull.committed(mq)
        if start >= 0:
            return start
        new = self._initial is not None and mq not in self._initial
        return await membership.start_offset(self._pull, mq, self.start_from,
                                             self.start_timestamp_ms, from_first=new)

    async def _puller(self, mq: MessageQueue) -> None:
        while self._buffers.position(mq)[0] < 0:
            try:
                self._buffers.start(mq, await self._start_offset(mq))
            except errors.ClientError as err:
                log.warning("start offset of %s: %s", mq, err)
                await asyncio.sleep(RETRY_S)
        room = self._room[mq]
        while True:
            room.clear()
            space = self._buffers.room(mq)
            if space == 0:
                await room.wait()  # back-pressure: until a poll takes from this queue
                continue
            offset, epoch = self._buffers.position(mq)
            try:
                res = await self._fetch(mq, offset, min(space, self.pull_batch_max))
            except errors.ClientError as err:
                self._watch.missing(mq.topic)  # (a queue gone with a route change?)
                log.warning("pull %s: %s", mq, err)
                await asyncio.sleep(RETRY_S)
                continue
            if res.status == bp.OFFSET_OUT_OF_RANGE:
                if offset < res.min_offset:  # retention moved past us
                    self._buffers.put(mq, epoch, (), res.min_offset)
                else:  # this replica lags behind what we read: never rewind, ask again
                    await asyncio.sleep(LAG_RETRY_S)
                continue
            self._buffers.put(mq, epoch, res.messages, res.next_offset)
            if res.messages:
                self._arrived.set()
            elif self.suspend_ms == 0:
                await asyncio.sleep(EMPTY_RETRY_S)  # the broker did not wait: we do, briefly

    async def _fetch(self, mq: MessageQueue, offset: int, most: int) -> PullResult:
        """One long-polling pull of up to ``most`` messages, filtered as subscribed."""
        sql = self._sql.get(mq.topic)
        tags = ["*"] if sql is not None else membership.tag_list(self._subs.get(mq.topic, "*"))
        return await self._pull.pull(mq, offset, most, self.suspend_ms, tags, sql=sql)
