"""The delay service: the leader's loop that delivers due timers (``broker.features.delay.model``).

On the leader only, once it has applied its own term's first entry (so the replicated index is
complete): read the pending timers due by the leader's clock, read each message from the
commitlog, and propose one ``TimerDeliver`` entry with their copies for their real queues;
then look again. The apply takes each timer out of the index, so the service keeps no progress
of its own: a new leader carries on from the index, a delivery proposed twice (by a deposed
leader, or again after a timeout) stores nothing twice. The entry's store time is read after
the due check, so no message is delivered before its time by the leader's clock.

The loop waits until the earliest pending due time (at most ``MAX_WAIT_S``: a follower that
becomes leader starts within that), or until a new timer is applied (``wake``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from broker.features.delay.entries import TimerDeliver
from broker.features.delay.model import SCHEDULE_QUEUE, SCHEDULE_TOPIC, timer_of
from broker.features.host import BrokerHost
from protocol.broker_errors import BrokerError
from protocol.errors import DLedgerError

log = logging.getLogger("broker.features.delay")

# Seeded bugs (tests only): "delay_early" delivers timers EARLY_MS before they are due;
# "timer_redeliver" (with the state machine's canary of that name) makes a new leader deliver
# again, from the schedule queue's start, every due message, as if no progress were replicated.
EARLY_MS = 3000
DELIVER_MAX = 256  # timers in one deliver entry, at most
DELIVER_BYTES_MAX = 1 << 20  # ... and their bodies' bytes, at most (beyond the first)
MAX_WAIT_S = 0.5  # the longest look-again period
BACKOFF_S = 0.2  # after a failed delivery (leadership lost, a timeout)


def look_again_s(ready: bool, next_due_ms: int | None, now_ms: float, stuck: bool) -> float:
    """How long the service waits before its next look: until the earliest due time (at once
    if it is overdue) when this node may deliver and the last look was not stuck, else the
    period ``MAX_WAIT_S`` (a new timer wakes it earlier)."""
    if not ready or next_due_ms is None:
        return MAX_WAIT_S
    ahead_ms = next_due_ms - now_ms
    if ahead_ms <= 0 and stuck:  # overdue and stuck: the period
        return MAX_WAIT_S
    return min(MAX_WAIT_S, max(0.0, ahead_ms / 1000))


class DelayService:
    def __init__(self, host: BrokerHost) -> None:
        self.host = host
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._proposed: set[int] = set()  # schedule offsets in a delivery not yet applied
        self._unreadable: set[int] = set()  # timers whose message the local log lacks
        self._term = -1
        self._replay_from = -1  # the canary's cursor over the schedule queue (-1: off)
        self._stuck = False  # the last look found due timers it could not deliver
        self.delivered = 0  # timers this node delivered as leader (for status)
        canaries = host.config.canaries
        self._early_ms = EARLY_MS if "delay_early" in canaries else 0
        self._redeliver = "timer_redeliver" in canaries

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def wake(self) -> None:
        self._wake.set()

    async def _loop(self) -> None:
        while True:
            await self._wait()
            try:
                while await self.deliver_due():
                    pass  # a backlog: deliver entry after entry
            except (DLedgerError, BrokerError) as err:
                log.warning("delivery of due timers failed (will retry): %s", err)
                await asyncio.sleep(BACKOFF_S)  # a back-off before the next try

    async def _wait(self) -> None:
        # Only a leader that may deliver now looks again at once: one not caught up yet (its
        # term's first entry not applied) would find nothing to do, and looping on with
        # nothing awaited would block the event loop, so the entry would never be applied.
        ready = self.host.node.is_leader and self.host.caught_up()
        wait_s = look_again_s(ready, self.host.state.timers.next_due_ms(),
                              time.time() * 1000 + self._early_ms, self._stuck)
        if wait_s > 0:
            try:
                async with asyncio.timeout(wait_s):  # (3.11's wait_for can lose a cancel)
                    await self._wake.wait()
            except TimeoutError:
                pass  # time to look again
        else:
            await asyncio.sleep(0)  # never a turn without yielding to the loop, whatever comes
        self._wake.clear()

    async def deliver_due(self) -> bool:
        """Propose one delivery of due timers, if this node may; True if it delivered any."""
        host = self.host
        core = host.node.core
        if core is None or not host.node.is_leader or not host.caught_up():
            self._proposed.clear()
            return False
        if core.term != self._term:  # a new term: whatever was proposed before is decided
            self._term = core.term
            self._proposed.clear()
            self._replay_from = 0 if self._redeliver else -1
        horizon_ms = int(time.time() * 1000) + self._early_ms
        items = self._replayed(horizon_ms) if self._replay_from >= 0 else self._due(horizon_ms)
        self._stuck = not items  # (due timers all unreadable, or in a delivery under way)
        if not items:
            return False
        offsets = [item[0] for item in items]
        self._proposed.update(offsets)
        try:
            config = host.config
            await host.leader_commit(TimerDeliver(
                int(time.time() * 1000), tuple(items), config.auto_create_topics,
                config.default_queues))
        finally:
            self._proposed.difference_update(offsets)
        self.delivered += len(items)
        return True

    def _due(self, horizon_ms: int) -> list[tuple[int, int, str, int, list[Any]]]:
        skip = self._proposed | self._unreadable
        items: list[tuple[int, int, str, int, list[Any]]] = []
        size = 0
        for due_ms, offset in self.host.state.timers.due(horizon_ms, DELIVER_MAX, skip):
            m = self._message(offset)
            if m is None:
                continue
            topic, queue_id, _ = timer_of(m)
            items.append((offset, due_ms, topic, queue_id, m))
            size += len(m[0])
            if size > DELIVER_BYTES_MAX:
                break
        return items

    def _replayed(self, horizon_ms: int) -> list[tuple[int, int, str, int, list[Any]]]:
        """The canary: due messages read from the schedule queue's start, progress ignored."""
        units = self.host.state.queues.get((SCHEDULE_TOPIC, SCHEDULE_QUEUE))
        items: list[tuple[int, int, str, int, list[Any]]] = []
        while units is not None and self._replay_from < len(units) and len(items) < DELIVER_MAX:
            m = self._message(self._replay_from)
            if m is not None:
                topic, queue_id, due_ms = timer_of(m)
                if due_ms > horizon_ms:
                    break
                items.append((self._replay_from, due_ms, topic, queue_id, m))
            self._replay_from += 1
        if not items:
            self._replay_from = -1  # replayed: back to the index
        return items

    def _message(self, offset: int) -> list[Any] | None:
        """The scheduled message at ``offset`` of the schedule queue, in entry form."""
        try:
            unit = self.host.state.queues[(SCHEDULE_TOPIC, SCHEDULE_QUEUE)][offset]
            return self.host.stored_message(unit.position, unit.slot)
        except (DLedgerError, IndexError) as err:  # retention took it (docs/operations.md)
            log.error("delayed message at schedule offset %d cannot be read: %s", offset, err)
            self._unreadable.add(offset)
            return None

    def status(self) -> dict[str, Any]:
        return {"pending": len(self.host.state.timers), "delivered_here": self.delivered,
                "next_due_ms": self.host.state.timers.next_due_ms()}
