"""The orderly push consumer (RocketMQ's ``MessageListenerOrderly``): each queue's messages one at
a time, in offset order, by the one member of the group that holds the queue's lock.

The member locks its queues at their group's leader (``broker.features.orderly.model``: a replicated lock of
60 s), renews every 20 s, and processes a queue only within ``LOCK_LEASE_S`` (30 s) of sending
its last granted lock request; a queue it cannot lock waits. On a rebalance it stops, commits
and unlocks a queue it gives away, and the next holder starts from the committed offset: so at
no instant do two members process one queue, and a queue's messages are processed in order
(after a crash or an expired lease, from the last committed offset again: at least once).

A listener answers ``SUCCESS``, or ``SUSPEND`` (also ``LATER``, None, an exception or the
consume timeout): the same message is given again after ``suspend_s`` (1 s), in place, holding
the queue; after ``max_reconsume_times`` suspensions (unbounded by default, RocketMQ's
``Integer.MAX``) it goes to ``%DLQ%<group>`` and the queue moves on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from client import errors
from client.consumer.push import PushConsumer, _QueueState
from client.types import ConsumeStatus, Listener, MessageQueue, ReceivedMessage
from protocol import broker_kinds as bp
from protocol.consume_rules import LOCK_LEASE_S, LOCK_RENEW_S
from protocol.errors import DLedgerError

log = logging.getLogger("client.consumer.orderly")

UNBOUNDED = 2**31 - 1  # RocketMQ's Integer.MAX_VALUE: suspend for ever
RETRY_S = 0.5  # between tries to lock a queue someone else holds, or after an error


class OrderlyPushConsumer(PushConsumer):
    def __init__(self, namesrv: str | Sequence[str], group: str, listener: Listener, *,
                 suspend_s: float = 1.0, max_reconsume_times: int = UNBOUNDED,
                 lock_renew_s: float = LOCK_RENEW_S, **options: Any) -> None:
        if options.get("model", "clustering") != "clustering":
            raise ValueError("orderly consumption is clustering (its queues are locked)")
        super().__init__(namesrv, group, listener, max_reconsume_times=min(
            max_reconsume_times, 10_000), **options)
        self.max_reconsume_times = max_reconsume_times
        self.suspend_s, self.lock_renew_s = suspend_s, lock_renew_s
        self.handover_wait = False
        self._leases: dict[MessageQueue, float] = {}  # queue -> lease end (monotonic)

    async def _open(self) -> None:
        await super()._open()
        self._tasks.append(asyncio.create_task(self._renew_loop()))

    def holds(self, mq: MessageQueue) -> bool:
        """Whether this member may process ``mq`` now (its lease runs)."""
        return self._leases.get(mq, 0.0) > time.monotonic()

    # -- locks -----------------------------------------------------------------------------------

    async def _lock(self, queues: list[MessageQueue]) -> None:
        """Lock (or renew) ``queues`` at their groups' leaders; each granted one's lease starts
        from the moment the request was sent."""
        by_group: dict[str, list[MessageQueue]] = {}
        for mq in queues:
            by_group.setdefault(mq.group, []).append(mq)
        for group, mqs in by_group.items():
            sent = time.monotonic()
            try:
                granted = await self._leader_call(mqs[0], bp.LOCK_BATCH, self.group,
                                                  self.client_id,
                                                  [[q.topic, q.queue_id] for q in mqs])
            except errors.ClientError as err:
                log.warning("lock of %d queue(s) of %s failed: %s", len(mqs), group, err)
                continue
            won = {(t, q) for t, q in granted}
            for mq in mqs:
                if (mq.topic, mq.queue_id) in won:
                    self._leases[mq] = sent + LOCK_LEASE_S

    async def _unlock(self, mq: MessageQueue) -> None:
        self._leases.pop(mq, None)
        try:
            await self._leader_call(mq, bp.UNLOCK_BATCH, self.group, self.client_id,
                                    [[mq.topic, mq.queue_id]])
        except errors.ClientError as err:  # it expires by itself (60 s)
            log.warning("unlock of %s failed: %s", mq, err)

    async def _leader_call(self, mq: MessageQueue, kind: int, *args: Any) -> Any:
        return await self._pull._call(mq, kind, *args, leader=True)

    async def _commit(self, mq: MessageQueue, state: _QueueState) -> None:
        if self.holds(mq):  # a lapsed holder's progress must not overwrite the next one's
            await super()._commit(mq, state)

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lock_renew_s)  # the renewal period
            if self._queues:
                await self._lock(sorted(self._queues))

    # -- queues ----------------------------------------------------------------------------------

    async def _take(self, mq: MessageQueue) -> None:
        state = _QueueState(-1)
        self._queues[mq] = state
        state.task = asyncio.create_task(self._orderly(mq, state))

    async def _drop(self, mq: MessageQueue, wait_s: float = 10.0) -> None:
        await super()._drop(mq, wait_s)  # stop, let the message in hand finish, commit
        await self._unlock(mq)  # only then may the next holder start from the commit

    async def _orderly(self, mq: MessageQueue, state: _QueueState) -> None:
        while True:
            if not self.holds(mq):
                await self._lock([mq])
                if not self.holds(mq):
                    await asyncio.sleep(RETRY_S)  # held by another member: ask again
                    continue
                state.next_pull = -1  # (re)acquired: start from what the group committed
            try:
                if state.next_pull < 0:
                    state.next_pull = await self._start_offset(mq)
                    state.committed = -1
                res = await self._fetch(mq, state.next_pull)
            except (errors.ClientError, DLedgerError) as err:
                log.warning("orderly pull %s: %s", mq, err)
                await asyncio.sleep(RETRY_S)  # a back-off before pulling that queue again
                continue
            if res.status == bp.OFFSET_OUT_OF_RANGE:
                state.next_pull = max(state.next_pull, res.min_offset)
                await asyncio.sleep(RETRY_S if state.next_pull > res.min_offset else 0)
                continue
            for m in res.messages:
                if not await self._process(mq, state, m):
                    break  # the lease ran out: lock again before anything more
            else:
                state.next_pull = res.next_offset

    async def _process(self, mq: MessageQueue, state: _QueueState, m: ReceivedMessage) -> bool:
        """``m`` until it succeeds or goes to the DLQ; False if the lease ran out first."""
        suspended = 0
        while True:
            if not self.holds(mq):
                return False
            state.processing += 1
            try:
                status = await self._call_listener([m])
            finally:
                state.processing -= 1
            if status is ConsumeStatus.SUCCESS:
                break
            suspended += 1
            if suspended > self.max_reconsume_times:
                try:
                    await self._pull.send_back(mq, m.queue_offset, -1)  # to the DLQ
                    break
                except errors.ClientError as err:
                    log.warning("orderly %s: dead letter of offset %d failed: %s", mq,
                                m.queue_offset, err)
            await asyncio.sleep(self.suspend_s)  # SUSPEND_CURRENT_QUEUE_A_MOMENT
        self.consumed += 1
        state.next_pull = m.queue_offset + 1
        return True
