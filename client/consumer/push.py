"""The push consumer: subscribe to topics with a tag expression, give a listener; the consumer
heartbeats every broker node of its topics, shares queues with the other members of its group
(clustering: one member per queue, rebalanced at once when the group's members or its topics'
routes change, ``client.consumer.watch``, and every 20 s) or reads every queue (broadcasting),
long-polls each of its queues, runs the listener with bounded concurrency, and commits progress
(the lowest offset not yet consumed per queue) every few seconds and on close.

A listener returns ``ConsumeStatus.SUCCESS`` or ``LATER`` (or raises, or returns None, or an
async listener does not answer within ``consume_timeout_s``, 15 min by default: all LATER). In
clustering a failed message is sent back to the broker (RocketMQ's send-back,
``broker.features.retry.model``): it comes again from ``%RETRY%<group>``, which every member subscribes to
itself, after 10 s, 30 s, 1 m ... (delay level 3 + its reconsume times), and after
``max_reconsume_times`` reconsumes (16) it goes to ``%DLQ%<group>`` instead. The queue's offset
moves on once the message is consumed or sent back; a send-back that fails (no leader
reachable) is retried here after ``later_delay_s`` and the committed offset never passes the
message meanwhile, so nothing is lost. In broadcasting a failed message is not retried (as
RocketMQ's broadcasting): it is logged and the consumer goes on.

Progress: clustering commits it to the broker (through the group's replicated log); broadcasting
keeps it in a local file per client id and group (``client.consumer.offset_store``, under
``offset_store_dir``, default ``~/.dledger/offsets``), loaded at start, written every
``commit_s`` and on close, so a restarted member resumes where it stopped. Its ``client_id``
must then be stable across restarts: broadcasting's default is ``<hostname>@DEFAULT`` (RocketMQ's
``ip@instanceName``), and a second broadcasting consumer of the group on the host while the first
runs takes ``<hostname>@DEFAULT#2`` (and so on: ``client.identity``); ``client_id`` is the one
taken once started. Clustering's default is ``<hostname>@<pid>#<random>``.

The tag expression of ``subscribe``: ``"A || B"``, ``"*"``; an empty one (or None) means ``*``,
as in RocketMQ. Or ``subscribe(topic, sql=...)``: an SQL92 expression over the messages'
properties and ``TAGS`` (RocketMQ's ``MessageSelector.bySql``), checked at once (a malformed one
raises ``BadFilterError`` naming the offset) and evaluated at the broker, which needs no setting
for it (RocketMQ's ``enablePropertyFilter``).

Batches: a pull asks for up to ``pull_batch_max`` messages of a queue (RocketMQ's
``pullBatchSize``, 32) and the listener gets up to ``consume_batch_max`` at once
(``consumeMessageBatchMaxSize``, 1): one result for the batch, so a failure sends back all of it.

A queue the group has no committed offset for starts at its last offset (``start_from="last"``,
the default), its first (``"first"``), or the first message stored at or after a time
(``"timestamp"`` with ``start_timestamp_ms``), as RocketMQ's CONSUME_FROM_* settings.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from client import errors
from client.consumer.listening import call_listener
from client.consumer.membership import check_start, start_offset, tag_expression, tag_list
from client.consumer.offset_store import LocalOffsetStore
from client.consumer.pull import PullConsumer
from client.consumer.rebalance import Strategy, strategy_of
from client.consumer.watch import GroupWatch
from client.errors import compile_filter
from client.identity import BROADCASTING_SLOTS, broadcasting_client_id, new_client_id
from client.lifecycle import Lifecycle
from client.producer.producer import trace_producer
from client.trace.tracer import Tracer
from client.types import ConsumeStatus, Listener, MessageQueue, PullResult, ReceivedMessage
from protocol import broker_kinds as bp
from protocol.auth import Credentials
from protocol.consume_rules import DEFAULT_MAX_RECONSUME_TIMES, MAX_RECONSUME_TIMES_LIMIT, retry_topic

log = logging.getLogger("client.consumer.push")

RETRY_ROUTE_S = 0.5  # between looks for the route of a retry topic just made
BATCH_MAX = 1024  # RocketMQ's bound of consumeMessageBatchMaxSize and pullBatchSize


@dataclass
class _QueueState:
    next_pull: int
    in_flight: set[int] = field(default_factory=set)
    task: asyncio.Task[None] | None = None
    committed: int = -1  # what was last committed (commits only when progress moves)
    processing: int = 0  # batches inside the listener right now
    dropped: bool = False  # given away by a rebalance: queued batches are skipped

    def committable(self) -> int:
        """-1 while the start offset is not known yet (nothing to commit)."""
        return min(self.in_flight) if self.in_flight else self.next_pull


class PushConsumer:
    def __init__(self, namesrv: str | Sequence[str], group: str, listener: Listener, *,
                 model: str = "clustering", strategy: str | Strategy = "averagely",
                 concurrency: int = 4,
                 consume_batch_max: int = 1, pull_batch_max: int = 32,
                 start_from: str = "last", heartbeat_s: float = 5.0,
                 rebalance_s: float = 20.0, commit_s: float = 5.0, suspend_ms: int = 1000,
                 later_delay_s: float = 1.0, client_id: str | None = None,
                 start_timestamp_ms: int | None = None,
                 offset_store_dir: str | os.PathLike[str] | None = None,
                 max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
                 consume_timeout_s: float = 900.0, trace: bool = False,
                 credentials: Credentials | None = None) -> None:
        self._credentials = credentials
        if model not in ("clustering", "broadcasting"):
            raise ValueError(f"model is clustering or broadcasting, not {model!r}")
        check_start(start_from, start_timestamp_ms)
        self.start_timestamp_ms = start_timestamp_ms
        self.group, self.listener, self.model = group, listener, model
        self.strategy = strategy_of(strategy)  # (a name, or one built: rebalance.by_config...)
        if not 1 <= consume_batch_max <= BATCH_MAX or not 1 <= pull_batch_max <= BATCH_MAX \
                or concurrency < 1:
            raise ValueError(f"consume_batch_max and pull_batch_max are 1..{BATCH_MAX}, "
                             f"concurrency at least 1")
        self.concurrency, self.start_from = concurrency, start_from
        self.consume_batch_max, self.pull_batch_max = consume_batch_max, pull_batch_max
        self.heartbeat_s, self.rebalance_s, self.commit_s = heartbeat_s, rebalance_s, commit_s
        self.suspend_ms, self.later_delay_s = suspend_ms, later_delay_s
        if not 0 <= max_reconsume_times <= MAX_RECONSUME_TIMES_LIMIT or consume_timeout_s <= 0:
            raise ValueError(f"max_reconsume_times is 0..{MAX_RECONSUME_TIMES_LIMIT} and "
                             f"consume_timeout_s positive")
        self.max_reconsume_times, self.consume_timeout_s = max_reconsume_times, consume_timeout_s
        self.retry_topic = retry_topic(group)
        self._retry_expected = False  # a send-back succeeded: the retry topic exists, or will
        self.handover_wait = True  # (an orderly consumer's queue locks do the hand-over)
        self.sent_back = 0  # messages handed back to the broker for a retry (or the DLQ)
        slots = 1 if client_id is not None else BROADCASTING_SLOTS
        if client_id is None:  # broadcasting resumes from a file named by it: keep it stable
            client_id = broadcasting_client_id() if model == "broadcasting" else new_client_id()
        self.client_id = client_id
        # trace: a record of each consume attempt to the trace topic (``client.trace.tracer``)
        names = [namesrv] if isinstance(namesrv, str) else namesrv
        self.tracer = Tracer(names, client_id, trace_producer(names)) if trace else None
        if self.tracer is not None:
            self.listener = self.tracer.listener(listener, group)
        self._namesrv = namesrv
        self._pull = PullConsumer(namesrv, group, credentials=credentials)
        self._life = Lifecycle(f"PushConsumer of group {group!r}")
        self._store = LocalOffsetStore(offset_store_dir, group, client_id, slots) \
            if model == "broadcasting" else None
        self._subs: dict[str, str] = {}  # topic -> its tag expression (or its SQL, as heartbeats tell)
        self._sql: dict[str, str] = {}  # topic -> its SQL92 filter, when it has one
        self._known_queues: set[MessageQueue] = set()
        self._queues: dict[MessageQueue, _QueueState] = {}
        self._work: asyncio.Queue[tuple[_QueueState, MessageQueue, list[ReceivedMessage]]] = \
            asyncio.Queue(maxsize=concurrency * 4)
        self._changed = asyncio.Event()
        self._watch = GroupWatch(self._pull, client_id, group, self._subs, model, heartbeat_s,
                                 self._changed)  # members, routes, subscriptions
        self._tasks: list[asyncio.Task[None]] = []
        self._requeues: set[asyncio.Future[None]] = set()  # failed batches going back to work
        self.consumed = 0
        self._initial_queues: set[MessageQueue] | None = None  # the queues seen at start()

    def subscribe(self, topic: str, tags: str | None = "*", *, sql: str | None = None) -> None:
        """Before start(): consume ``topic``, messages whose tag is in ``tags`` (``A || B``, ``*``;
        an empty expression or None is ``*``, as RocketMQ's), or those matching ``sql``."""
        expression = tag_expression(tags)
        self._sql.pop(topic, None)
        if sql is not None:
            if expression != "*":
                raise ValueError("subscribe filters by tags or by sql, not both")
            compile_filter(sql)  # BadFilterError now, not at the first pull
            self._sql[topic] = expression = sql
        self._subs[topic] = expression

    async def _fetch(self, mq: MessageQueue, offset: int) -> PullResult:
        """One long-polling pull of up to ``pull_batch_max`` messages, filtered as subscribed."""
        sql = self._sql.get(mq.topic)
        tags = ["*"] if sql is not None else tag_list(self._subs[mq.topic])
        return await self._pull.pull(mq, offset, self.pull_batch_max, self.suspend_ms, tags,
                                     sql=sql)

    @property
    def assigned(self) -> list[MessageQueue]:
        return sorted(self._queues)

    @property
    def members(self) -> list[str]:
        """The group's live members, as the last heartbeat (or notice) told."""
        return self._watch.members

    async def start(self) -> PushConsumer:
        """Join the group and start consuming; a second start() does nothing."""
        if not self._subs:
            raise ValueError("subscribe to a topic before start()")
        await self._life.start(self._start)
        return self

    async def _start(self) -> None:
        try:
            await self._open()
        except BaseException:  # leave nothing open or running behind a failed start (it may
            await self._stop_tasks()  # be retried)
            for state in self._queues.values():
                state.dropped = True  # (its batches waiting for a worker are skipped)
            self._queues.clear()
            self._known_queues.clear()
            await self._pull.close()
            self._pull = PullConsumer(self._namesrv, self.group, credentials=self._credentials)
            self._watch = GroupWatch(self._pull, self.client_id, self.group, self._subs,
                                     self.model, self.heartbeat_s, self._changed)
            if self._store is not None:
                self._store.close()
            raise

    async def _open(self) -> None:
        if self._store is not None:
            await asyncio.to_thread(self._store.open)
            self._named(self._store.client_id)  # (a default id's spare, if the first is in use)
        if self.model == "clustering":  # failed messages come back through the retry topic
            self._subs[self.retry_topic] = "*"
        await self._pull.start()
        for topic in self._subs:  # a topic created a moment ago: wait for its route first
            try:
                await self._pull.fetch_queues(topic, wait=topic != self.retry_topic)
            except errors.TopicNotFoundError:
                continue  # not there yet: the periodic rebalance picks it up later
        await self._watch.heartbeat()
        await self._rebalance()
        self._initial_queues = set(self._known_queues)
        loops = [self._watch.heartbeats(), self._watch.routes(), self._rebalance_loop(),
                 self._commit_loop()]
        self._tasks = [asyncio.create_task(c) for c in loops]
        self._tasks += [asyncio.create_task(self._worker()) for _ in range(self.concurrency)]

    async def close(self) -> None:
        """Stop consuming, store the progress, leave the group."""
        if not self._life.close():
            return
        await self._stop_tasks()
        await self._commit_all()
        if self._store is not None:
            self._store.close()
        await self._watch.heartbeat(leave=True)
        await self._pull.close()
        if self.tracer is not None:
            await self.tracer.close()

    async def _stop_tasks(self) -> None:
        """Cancel the loops, the workers and the pullers, and wait until they ended."""
        tasks = self._tasks + [s.task for s in self._queues.values() if s.task]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []

    def _named(self, client_id: str) -> None:
        self.client_id = self._watch.client_id = client_id
        if self.tracer is not None:
            self.tracer.client_id = client_id

    async def __aenter__(self) -> PushConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- membership and rebalancing ------------------------------------------------------------------

    async def _rebalance(self) -> None:
        wanted: set[MessageQueue] = set()
        for topic in self._subs:
            retry = topic == self.retry_topic  # it exists from the group's first send-back on
            awaited = retry and self._retry_expected and \
                not any(q.topic == topic for q in self._known_queues)
            try:  # a retry topic just made is registered a moment later: wait for its route
                queues = await self._pull.fetch_queues(topic, wait=not retry or awaited)
            except errors.TopicNotFoundError:
                if awaited:  # not routed yet: look again soon, not at the periodic rebalance
                    asyncio.get_running_loop().call_later(RETRY_ROUTE_S, self._changed.set)
                elif not retry:
                    self._watch.saw(topic, ())
                continue
            if not retry:
                self._watch.saw(topic, queues)  # (a change of them: the watch reads it closely)
            self._known_queues.update(queues)
            mine = queues if self.model == "broadcasting" else \
                self.strategy(self.client_id, self.members, queues)
            wanted.update(mine)
        for mq in [q for q in self._queues if q not in wanted]:
            await self._drop(mq)
        for mq in sorted(wanted - set(self._queues)):
            await self._take(mq)

    async def _take(self, mq: MessageQueue) -> None:
        state = _QueueState(-1)
        self._queues[mq] = state
        state.task = asyncio.create_task(self._puller(mq, state))

    async def _start_offset(self, mq: MessageQueue) -> int:
        if self.model == "clustering" and len(self.members) > 1 and self.handover_wait:
            # Hand-over: the queue's previous owner notices the new membership at its next
            # heartbeat, finishes what is in its listener and commits; only then read the offset.
            await asyncio.sleep(2 * self.heartbeat_s + self.commit_s)
        start = await self._pull.committed(mq) if self._store is None else self._store.get(mq)
        if start < 0:
            # A queue that appeared after start() (its topic was created, or a group or queues
            # were added, while we ran) is read from its beginning whatever start_from says:
            # its messages were all sent after we subscribed.
            new = self._initial_queues is not None and mq not in self._initial_queues
            start = await start_offset(self._pull, mq, self.start_from, self.start_timestamp_ms,
                                       from_first=new or mq.topic == self.retry_topic)
        return start

    async def _drop(self, mq: MessageQueue, wait_s: float = 10.0) -> None:
        """Give a queue away: stop pulling it, skip its queued batches (the next owner gets them
        from the committed offset), let the batches in the listener finish, then commit. So a
        rebalance without faults delivers nothing twice."""
        state = self._queues.pop(mq)
        state.dropped = True
        if state.task:
            state.task.cancel()
            await asyncio.gather(state.task, return_exceptions=True)
        deadline = asyncio.get_running_loop().time() + wait_s
        while state.processing and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)  # batches already in the listener finish first
        await self._commit(mq, state)

    async def _rebalance_loop(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.rebalance_s):  # (not wait_for: see listening)
                    await self._changed.wait()
            except TimeoutError:
                pass  # the periodic rebalance
            self._changed.clear()
            try:
                await self._rebalance()
            except errors.ClientError as err:
                log.warning("rebalance of %s failed: %s", self.group, err)

    # -- pulling, consuming, committing ----------------------------------------------------------------

    async def _puller(self, mq: MessageQueue, state: _QueueState) -> None:
        while state.next_pull < 0:
            try:
                state.next_pull = await self._start_offset(mq)
            except errors.ClientError as err:
                log.warning("start offset of %s: %s", mq, err)
                await asyncio.sleep(0.2)  # a back-off before asking again
        while True:
            try:
                res = await self._fetch(mq, state.next_pull)
            except errors.ClientError as err:
                self._watch.missing(mq.topic)  # (a queue gone with a route change?)
                log.warning("pull %s: %s", mq, err)
                await asyncio.sleep(0.2)  # a back-off before pulling that queue again
                continue
            if res.status == bp.OFFSET_OUT_OF_RANGE:
                if state.next_pull < res.min_offset:
                    state.next_pull = res.min_offset  # retention moved past us
                else:  # this replica lags behind what we read: never rewind, ask again
                    await asyncio.sleep(0.05)  # a back-off before pulling that queue again
                continue
            for k in range(0, len(res.messages), self.consume_batch_max):
                batch = list(res.messages[k : k + self.consume_batch_max])
                state.in_flight.update(m.queue_offset for m in batch)
                await self._work.put((state, mq, batch))  # bounded: back-pressure on the puller
            state.next_pull = res.next_offset

    async def _worker(self) -> None:
        while True:
            state, mq, batch = await self._work.get()
            if state.dropped:
                continue  # the queue's new owner delivers it from the committed offset
            state.processing += 1
            try:
                status = await self._call_listener(batch)
            finally:
                state.processing -= 1
            if status is ConsumeStatus.SUCCESS or self.model == "broadcasting":
                if status is ConsumeStatus.SUCCESS:
                    self.consumed += len(batch)
                else:  # RocketMQ's broadcasting does not retry: the member goes on
                    log.warning("broadcasting consumer %s of %s: %d message(s) of %s failed and "
                                "are not retried (offsets %d-%d)", self.client_id, self.group,
                                len(batch), mq, batch[0].queue_offset, batch[-1].queue_offset)
                state.in_flight.difference_update(m.queue_offset for m in batch)
            else:  # LATER: back to the broker (retry topic or DLQ), or here again later
                await self._send_back(state, mq, batch)

    async def _send_back(self, state: _QueueState, mq: MessageQueue,
                         batch: list[ReceivedMessage]) -> None:
        got = await asyncio.gather(*(self._pull.send_back(mq, m.queue_offset, 0,
                                                          self.max_reconsume_times)
                                     for m in batch), return_exceptions=True)
        failed = [m for m, g in zip(batch, got) if isinstance(g, BaseException)]
        for err in {str(g) for g in got if isinstance(g, BaseException)}:
            log.warning("send-back to %s failed (retried here in %.1f s): %s", mq.group,
                        self.later_delay_s, err)
        state.in_flight.difference_update(m.queue_offset for m, g in zip(batch, got)
                                          if not isinstance(g, BaseException))
        self.sent_back += len(batch) - len(failed)
        if len(failed) < len(batch) and not self._retry_expected:
            self._retry_expected = True
            self._changed.set()  # the retry topic may be new: rebalance to read it
        if failed:  # the offset stays uncommitted meanwhile: nothing is lost
            asyncio.get_running_loop().call_later(self.later_delay_s, self._requeue,
                                                  state, mq, failed)

    def _requeue(self, state: _QueueState, mq: MessageQueue, batch: list[ReceivedMessage]) -> None:
        if not state.dropped:
            task = asyncio.ensure_future(self._work.put((state, mq, batch)))
            self._requeues.add(task)  # (held until done: the loop keeps only weak references)
            task.add_done_callback(self._requeues.discard)

    async def _call_listener(self, batch: list[ReceivedMessage]) -> ConsumeStatus:
        return await call_listener(self.listener, batch, self.group, self.consume_timeout_s)

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.commit_s)  # the commit period
            await self._commit_all()

    async def _commit_all(self) -> None:
        for mq, state in list(self._queues.items()):
            await self._commit(mq, state)
        changed = self._store.changed() if self._store is not None else None
        if self._store is not None and changed is not None:
            try:
                await asyncio.to_thread(self._store.write, changed)
            except errors.OffsetStoreError as err:
                log.warning("broadcasting progress of %s: %s", self.group, err)

    async def _commit(self, mq: MessageQueue, state: _QueueState) -> None:
        offset = state.committable()
        if offset < 0 or offset == state.committed:
            return  # the start offset is not known yet, or the progress did not move
        if self._store is not None:  # broadcasting: this member's progress, in its local file
            self._store.offsets[mq] = offset
            state.committed = offset
            return
        try:
            await self._pull.commit(mq, offset)
            state.committed = offset
        except errors.ClientError as err:
            log.warning("commit %s: %s", mq, err)
