"""The leader's side of pop consumption (``broker.features.pop.model``): receive, ack, change invisibility,
dead letters. Plans each change from the applied state and the commitlog, proposes it as one
entry, and answers from what its apply did. Owns nothing replicated; its state is a lock per
(group, topic, queue), so that this leader never plans two pops of one queue at once (a pop
planned on a stale view would be refused at apply anyway: ``PopConflict``), an event per queue
a receive waits on, set when a message of it leaves flight, the priorities it read ahead
(``scan.PriorityMemo``) and, under the seeded bug ``priority_park_lost``, what it parked.

A receive (POP_RECEIVE) looks at the queues of the topic in turn (or the one named): first the
messages in flight whose invisible time is over (those past the group's maximum delivery
attempts, its own setting, ``broker.features.admin.model``, or else the request's default, go
to its dead-letter queue, ``%DLQ%<group>``, with the copy ``broker.features.retry.model``
makes), then fresh ones from the cursor, filtered by tag or SQL92 (a filtered message is
passed, as a pull passes it). A message whose TTL has passed (``protocol.message_ttl``, by this
leader's clock) is passed as a filtered one, or, handed out again or released, acknowledged
at once: never delivered. A topic not created yet reads as empty (its first send may create it), as a
pull reads it. It long-polls up to ``poll_ms`` for new messages, a message's invisible time
to end, or an ack or dead letter that frees a message group. A message with a message group
(``MESSAGE_GROUP_PROPERTY``) is ordered: FIFO's rule is ``broker.features.pop.model``'s; a
receive first releases the messages held back whose group is free, then scans on past the
ones whose group is busy, holding them back, so a queue's other groups proceed. Priority: a
receive hands out the higher priorities of a queue first, parking the lower ones it passes
(``broker.features.pop.scan``); the rows it answers are sorted highest priority first.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from broker.core.applied import ApplyResult
from broker.core.codec import Message
from broker.core.entries import TopicPut
from broker.core.read_filter import ReadFilter
from broker.features.host import BrokerHost
from broker.features.pop.entries import PopAck, PopChange, PopDead, PopEntry
from broker.features.pop.model import INFLIGHT_MAX, PopKey
from broker.features.pop.scan import PriorityMemo, scan_by_priority, scan_in_order
from broker.features.retry.model import DLQ_QUEUES, dlq_topic, send_back
from protocol.broker_kinds import SendRefusedError, offset_msg_id, unscoped
from protocol.consume_rules import MESSAGE_GROUP_PROPERTY
from protocol.errors import DLedgerError
from protocol.filter_sql import SqlFilter
from protocol.message_ttl import expired
from protocol.priority import priority_of
from protocol.topics import PERM_RW

WAKE_S_MAX = 1.0  # a long poll looks again at least this often (messages coming visible)
PLANS_MAX = 4  # pops one look at a queue commits while they hand out nothing (scans on)
RELEASE_RETRY_S = 0.05  # a receive looks again this soon while a message held back may go


class PopHost(BrokerHost, Protocol):
    def retained_offset(self, topic: str, queue_id: int) -> int:
        """The queue's first offset whose message the local log still holds."""
        ...

    def read_message(self, position: int, slot: int, entries: dict[int, list[Any]]) -> Message:
        """A stored message (``entries`` caches the entries decoded)."""
        ...

    def arrival(self, topic: str, queue_id: int) -> asyncio.Event:
        """Set when the next message for the queue is applied here."""
        ...

    def count_expired(self, path: str, count: int) -> None:
        """``count`` expired messages (``protocol.message_ttl``) a read on ``path`` passed."""
        ...


class PopService:
    def __init__(self, host: PopHost) -> None:
        self.host = host
        self._locks: dict[PopKey, asyncio.Lock] = {}
        self._freed: dict[PopKey, asyncio.Event] = {}  # set by an ack or dead letter of the queue
        self._memo = PriorityMemo()  # offsets of a priority above 0 ahead of each cursor
        self._turn = 0  # rotates the queue a receive of "any queue" looks at first
        self.popped = 0  # messages this node handed out as leader (for status)
        self.dead = 0
        self._ttl_ignored = "ttl_ignored" in host.config.canaries  # a seeded bug (tests only)
        # the seeded bug priority_park_lost: a leader sees only the offsets it parked itself in
        # its term (a new leader forgets the parked set: those are never handed out)
        self._park_lost = "priority_park_lost" in host.config.canaries
        self._parked_term, self._mine_parked = -1, dict[PopKey, set[int]]()

    # -- receive --------------------------------------------------------------------------------

    async def receive(self, group: str, topic: str, queue_id: int, max_messages: int,
                      invisible_ms: int, tags: list[str], sql: SqlFilter | None, poll_ms: int,
                      max_attempts: int) -> list[Any]:
        """POP_RECEIVE: up to ``max_messages`` messages of one queue, each
        ``[queue id, queue offset, body, tags, keys, unique key, [[k, v]...], born ms, store ms,
        offset msg id, epoch, attempt]``; [] when the long poll ends with none. A message due
        again after ``max_attempts`` deliveries goes to the dead-letter queue instead; the
        group's own setting (``broker.features.admin.model``), if it has one, comes first."""
        host = self.host
        host.require_leader()
        await host.node.read_barrier()  # plan on everything committed before this term
        deadline = time.monotonic() + poll_ms / 1000
        while True:
            cfg = host.state.topics.get(topic)
            if cfg is None:  # not created yet (its first send auto-creates it): nothing to read
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                await self._wait(group, topic, [0], min(remaining, WAKE_S_MAX))
                host.require_leader()
                continue
            if not cfg.readable:
                raise SendRefusedError("NO_PERMISSION", f"{topic} is not readable")
            if queue_id >= cfg.read_queues:
                raise SendRefusedError("QUEUE_NOT_FOUND", f"queue {queue_id} of {topic}")
            qids = [queue_id] if queue_id >= 0 else _rotated(cfg.read_queues, self._turn)
            self._turn += 1
            attempts = host.state.subscription_groups.max_delivery_attempts(group, max_attempts)
            for qid in qids:
                out = await self._receive_queue(group, topic, qid, max_messages, invisible_ms,
                                                tags, sql, attempts)
                if out:
                    self.popped += len(out)
                    return out
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            await self._wait(group, topic, qids, min(remaining, WAKE_S_MAX))
            host.require_leader()

    async def _wait(self, group: str, topic: str, qids: list[int], timeout_s: float) -> None:
        """Until a message arrives in one of the queues, one in flight comes visible, one
        leaves flight (its group may be free now), or the timeout."""
        now_ms = int(time.time() * 1000)
        pops = self.host.state.pops
        for qid in qids:
            due = pops.next_visible_ms((group, topic, qid))
            if due is not None:
                timeout_s = max(0.0, min(timeout_s, (due - now_ms) / 1000 + 0.001))
            if pops.releasable((group, topic, qid)):  # (freed by an ack this look just missed)
                timeout_s = min(timeout_s, RELEASE_RETRY_S)
        events = [self.host.arrival(topic, q) for q in qids]
        events += [self._freed.setdefault((group, topic, q), asyncio.Event()) for q in qids]
        waits = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _receive_queue(self, group: str, topic: str, qid: int, max_messages: int,
                             invisible_ms: int, tags: list[str], sql: SqlFilter | None,
                             max_attempts: int) -> list[Any]:
        key = (group, topic, qid)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            for _ in range(PLANS_MAX):  # a pop that handed out nothing looks again past it
                result = await self._pop_once(key, max_messages, invisible_ms, tags, sql,
                                              max_attempts)
                if result is None:
                    return []
                if result.popped:
                    rows, gone = self._rows(topic, qid, result)
                    if gone:  # retention deleted them (a redelivery, a release, a parked one):
                        await self._commit(PopAck(int(time.time() * 1000), group, topic, qid,
                                                  tuple(gone)))  # nothing to hand out: acked
                    rows = await self._unexpired(key, rows)
                    if rows:  # (the highest priority first; a stable sort keeps the rest)
                        return sorted(rows, key=lambda r: -priority_of(r[6]) if r[6] else 0)
            return []

    async def _unexpired(self, key: PopKey, rows: list[Any]) -> list[Any]:
        """The rows handed out but those expired by now (a redelivery, a release, or one that
        expired since the scan): those are acknowledged at once, never delivered."""
        now_ms = int(time.time() * 1000)
        gone = [(r[1], r[10]) for r in rows if r[6] and expired(r[6], r[8], now_ms)]
        if not gone or self._ttl_ignored:
            return rows
        group, topic, qid = key
        await self._commit(PopAck(now_ms, group, topic, qid, tuple(gone)))
        self.host.count_expired("pop", len(gone))
        return [r for r in rows if not (r[6] and expired(r[6], r[8], now_ms))]

    async def _pop_once(self, key: PopKey, max_messages: int, invisible_ms: int,
                        tags: list[str], sql: SqlFilter | None,
                        max_attempts: int) -> ApplyResult | None:
        """One pop planned from the applied state and committed: its apply's result (what it
        handed out; perhaps nothing, when it only moved the cursor past messages filtered out
        or held back), or None when there was nothing to do or the plan was refused."""
        group, topic, qid = key
        state = self.host.state
        now_ms = int(time.time() * 1000)
        redeliver = []
        for off, f in state.pops.due(key, now_ms)[:max_messages]:
            if f.attempt >= max_attempts:
                await self._dead_letter(key, off, f.epoch, max_attempts)
            else:
                redeliver.append(off)
        # (read after the dead letters: one of those may have freed its group)
        release = state.pops.releasable(key)[:max_messages - len(redeliver)]
        q = state.pops.get(key)
        base, length = state.queue_range(topic, qid)  # the queue as every replica's apply sees it
        first = max(base, self.host.retained_offset(topic, qid))  # ... as this log still holds it
        cursor = q.cursor if q is not None else state.offsets.get(key, first)
        start = max(cursor, base)  # where the entry's range begins (the apply checks it)
        lo = max(start, first)  # where reading begins: past what retention deleted here, which
        # the entry's range covers unread (retention is local; the apply cannot know it)
        capacity = INFLIGHT_MAX - (q.holding() if q else 0)
        room = min(max_messages - len(redeliver) - len(release), capacity)
        flt = ReadFilter(tags, sql, now_ms, exact_tags=True, ttl=not self._ttl_ignored)
        parked, ahead = self._parked(key), self._memo.ahead(self.host, key, lo, length)
        plan = scan_by_priority(self.host, topic, qid, lo, length, room, capacity, flt, parked,
                                ahead) if room > 0 and (parked or ahead) else None
        held: list[tuple[int, str]] = []
        if plan is not None:
            fresh, park, unpark, hi = plan
        else:
            (fresh, held, hi), park, unpark = scan_in_order(
                self.host, topic, qid, lo, length, room, capacity, flt, state.pops.gate(key)), [], []
        if flt.expired:
            self.host.count_expired("pop", flt.expired)
        if not redeliver and not release and not unpark and hi == start:
            return None
        entry = PopEntry(now_ms, group, topic, qid, invisible_ms, cursor, tuple(redeliver),
                         start if hi > start else cursor, hi if hi > start else cursor, tuple(fresh),
                         tuple(held), tuple(release), tuple(park), tuple(unpark))
        result = await self.host.commit(self.host.state.registry.encode(entry))
        if self._park_lost and result.status == "OK":
            self._mine_parked.setdefault(key, set()).update(off for off, _ in park)
        # (a conflict: a receive waiting plans again from the applied state)
        return result if result.status == "OK" else None

    def _parked(self, key: PopKey) -> dict[int, int]:
        """The queue's parked offsets (under the seeded bug, those this leader parked in its
        term only)."""
        parked = self.host.state.pops.parked(key)
        if not self._park_lost:
            return parked
        core = self.host.node.core
        term = core.term if core is not None else -1
        if term != self._parked_term:  # a new term: the canary forgets what was parked
            self._parked_term, self._mine_parked = term, {}
        mine = self._mine_parked.get(key, set())
        return {off: p for off, p in parked.items() if off in mine}

    def _rows(self, topic: str, qid: int, result: ApplyResult
              ) -> tuple[list[Any], list[tuple[int, int]]]:
        """The messages a pop handed out, as rows; and the receipts (offset, epoch) of those
        the log no longer holds (retention deleted them since they were first handed out)."""
        entries: dict[int, list[Any]] = {}
        out, gone = [], []
        for off, attempt in result.popped:
            units = self.host.state.units(topic, qid, off, 1)
            try:
                unit = units[0] if units else None
                m = self.host.read_message(unit.position, unit.slot, entries) if unit else None
            except DLedgerError:  # retention deleted its segment
                m = None
            if unit is None or m is None:
                gone.append((off, result.index))
                continue
            out.append([qid, off, m.body, m.tags, list(m.keys), unscoped(m.unique_key),
                        [list(p) for p in m.properties], m.born_ts_ms, unit.store_ts_ms,
                        offset_msg_id(self.host.group, unit.position, unit.slot),
                        result.index, attempt])
        return out, gone

    # -- ack, change, dead letters ------------------------------------------------------------

    async def ack(self, group: str, topic: str, qid: int,
                  receipts: list[tuple[int, int]]) -> list[bool]:
        """POP_ACK: per (offset, epoch), acknowledged (or already) or a stale receipt."""
        self.host.require_leader()
        entry = PopAck(int(time.time() * 1000), group, topic, qid, tuple(receipts))
        return list((await self._commit(entry)).acked)

    async def change(self, group: str, topic: str, qid: int, offset: int, epoch: int,
                     invisible_ms: int) -> int:
        """POP_CHANGE: the offset invisible for ``invisible_ms`` from now; its new epoch."""
        self.host.require_leader()
        entry = PopChange(int(time.time() * 1000), group, topic, qid, offset, epoch, invisible_ms)
        return (await self._commit(entry)).index

    async def dead_letter(self, group: str, topic: str, qid: int, offset: int, epoch: int,
                          max_attempts: int) -> str:
        """POP_DEAD: the offset to the group's dead-letter queue at once (the consumer gave up
        on it); the dead-letter topic."""
        self.host.require_leader()
        await self.host.node.read_barrier()
        return await self._dead_letter((group, topic, qid), offset, epoch, max_attempts)

    async def _dead_letter(self, key: PopKey, offset: int, epoch: int, max_attempts: int) -> str:
        group, topic, qid = key
        units = self.host.state.units(topic, qid, offset, 1)
        if not units:
            raise SendRefusedError("MESSAGE_NOT_FOUND", f"{topic} queue {qid} offset {offset}")
        unit = units[0]
        try:
            m = self.host.read_message(unit.position, unit.slot, {})
        except DLedgerError as err:  # retention deleted it: nothing to copy, it leaves flight
            await self._commit(PopAck(int(time.time() * 1000), group, topic, qid, ((offset, epoch),)))
            raise SendRefusedError("MESSAGE_NOT_FOUND", f"{topic}@{offset}: {err}") from err
        raw = [m.body, m.tags, list(m.keys), m.unique_key, [list(p) for p in m.properties],
               m.born_ts_ms]
        msg_id = offset_msg_id(self.host.group, unit.position, unit.slot)
        back = send_back(group, raw, topic, msg_id, -1, max_attempts)
        target = dlq_topic(group)
        if target not in self.host.state.topics:
            await self.host.leader_commit(TopicPut(target, DLQ_QUEUES, DLQ_QUEUES, PERM_RW,
                                                     system=True))
        await self._commit(PopDead(int(time.time() * 1000), group, topic, qid, offset, epoch,
                                   target, back.message))
        self.dead += 1
        return target

    async def _commit(self, entry: Any) -> ApplyResult:
        result = await self.host.commit(self.host.state.registry.encode(entry))
        if result.status != "OK":
            raise SendRefusedError(result.status, result.detail)
        if isinstance(entry, PopAck | PopDead):  # a message left flight: wake the receives
            freed = self._freed.pop((entry.group, entry.topic, entry.queue_id), None)
            if freed is not None:
                freed.set()
        return result

    def status(self) -> dict[str, int]:
        return {"popped_here": self.popped, "pop_dead_lettered_here": self.dead}


def _rotated(n: int, turn: int) -> list[int]:
    start = turn % n if n else 0
    return [(start + k) % n for k in range(n)]


__all__ = ["MESSAGE_GROUP_PROPERTY", "PopService"]
