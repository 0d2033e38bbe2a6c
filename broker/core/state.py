"""The broker's state machine: applied to committed log entries in log order, on every replica.

Owns topics, consume queues (per (topic, queue): packed units pointing into the commitlog,
RocketMQ's 20-byte idea: position, size, tag hash, plus the slot within a batch entry and the
store time; see ``consumequeue``), consumer-group offsets, and the dedup table of unique keys
(``dedup``). Queue offsets are assigned here, at apply time, so every replica derives the same
(topic, queue, offset) -> message mapping forever. Pure and deterministic: no clock (times come from the entries), no I/O;
``snapshot``/``restore`` give the shell a checkpoint to persist.
"""

from __future__ import annotations

import bisect
import struct

from dataclasses import dataclass, field
from typing import Any

import cbor2

from broker.core.consumequeue import UNIT, CQUnit, MemoryQueues, QueueStore, UnitQueue
from broker.core.dedup import DedupTable
from broker.features.delay.model import SCHEDULE_QUEUE, SCHEDULE_TOPIC, DelayIndex, timer_of
from broker.core.entries import (
    BrokerEntry,
    LockQueues,
    OffsetCommit,
    OffsetReset,
    StoredRuns,
    StoredSend,
    TimerDeliver,
    TopicDelete,
    TopicPut,
    TxnCheck,
    TxnEnd,
    decode_for_apply,
)
from protocol.broker_errors import BadEntryError, BrokerError
from broker.features.acl.model import AclTable
from broker.features.acl.entries import AclDelete, AclPut
from broker.features.orderly.model import LockTable
from broker.features.pop.model import POP_CANARIES, PopTable
from broker.features.pop.apply import apply_pop
from broker.features.pop.entries import PopAck, PopChange, PopDead, PopEntry
from protocol.topics import TopicConfig, validate_config
from broker.core.applied import ApplyResult, tag_hash
from broker.features.txn.model import HALF_QUEUE, HALF_TOPIC, TxnTable
from broker.features.txn.apply import apply_end, apply_half


CHECKPOINT_VERSION = 7  # 7: + the ACL; 6: + pop consumption; 5: queues by number and record,
READ_VERSIONS = (1, 2, 3, 4, 5, 6, CHECKPOINT_VERSION)  # fingerprint dedup; 4: + transactions;
# 3: + timers, locks; 2: packed queues, columnar dedup; 1: lists
STATE_CANARIES = frozenset({"timer_redeliver", "lock_unfenced", "txn_half_visible", *POP_CANARIES})


@dataclass(frozen=True)
class StateConfig:
    dedup_window_ms: int = 10 * 60 * 1000  # a retried send within this window is not stored again
    dedup_entries_max: int = 1_000_000
    # Seeded bugs (tests only, on every replica alike): "timer_redeliver" stores a delivered
    # timer's message again when a delivery names it twice (the index's check skipped);
    # "lock_unfenced" grants a queue lock whoever holds it; "txn_half_visible" stores a half
    # message in its real queue too, visible before its transaction commits; "pop_ack_lost"
    # answers a pop ack but keeps the message in flight, so it is delivered again.
    canaries: frozenset[str] = frozenset()


@dataclass
class BrokerState:
    config: StateConfig = field(default_factory=StateConfig)
    applied_index: int = 0
    topics: dict[str, TopicConfig] = field(default_factory=dict)
    queues: dict[tuple[str, int], UnitQueue] = field(default_factory=dict)
    next_queue_no: int = 0  # numbers queues in the order they are created (names their files)
    offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)
    # unique key -> (topic, queue id, queue offset, store time), oldest first
    dedup: DedupTable = field(init=False)
    timers: DelayIndex = field(default_factory=DelayIndex)  # pending delayed messages
    locks: LockTable = field(default_factory=LockTable)  # orderly consumers' queue locks
    txns: TxnTable = field(default_factory=TxnTable)  # open transactions, recent decisions
    pops: PopTable = field(init=False)  # pop consumers' messages in flight (broker.features.pop.model)
    acl: AclTable = field(default_factory=AclTable)  # accounts and permissions (broker.features.acl.model)
    # The entry ``apply`` last decoded (None: a no-op or a malformed one), for derived data
    # such as the key index (``broker.features.query.index``) that would otherwise decode it again.
    last_entry: object = field(default=None, compare=False, repr=False)
    # Where queues keep their units: in memory (the default), or in files (a broker process).
    queue_store: QueueStore = field(default_factory=MemoryQueues, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.dedup = DedupTable(self.config.dedup_window_ms, self.config.dedup_entries_max)
        self.pops = PopTable(self.config.canaries & POP_CANARIES)

    # -- apply --------------------------------------------------------------------------------

    def apply(self, index: int, position: int, data: bytes) -> ApplyResult:
        """Apply the committed entry at ``index`` (commitlog ``position``). Never raises on a
        bad entry: every replica records the same error result and moves on."""
        if index <= self.applied_index:
            raise ValueError(f"entry {index} applied twice (applied index {self.applied_index})")
        self.applied_index = index
        self.last_entry = None
        if not data:
            return ApplyResult(index, "NOOP")
        try:
            entry = self.last_entry = decode_for_apply(data)
        except BadEntryError as err:
            return ApplyResult(index, "BAD_ENTRY", detail=str(err))
        try:
            return self._apply(index, position, entry)
        except BrokerError as err:
            return ApplyResult(index, err.code, detail=str(err))

    def _apply(self, index: int, position: int,
               entry: BrokerEntry | StoredSend | StoredRuns) -> ApplyResult:
        if isinstance(entry, StoredSend):
            return self._send(index, position, entry)
        if isinstance(entry, StoredRuns):
            return self._send_runs(index, position, entry)
        if isinstance(entry, TopicPut):
            cfg = validate_config(TopicConfig(entry.name, entry.read_queues, entry.write_queues,
                                              entry.perm), allow_system=entry.system)
            self.topics[cfg.name] = cfg
            return ApplyResult(index, "OK", topic=cfg.name)
        if isinstance(entry, TopicDelete):
            if self.topics.pop(entry.name, None) is None:
                return ApplyResult(index, "TOPIC_NOT_FOUND", topic=entry.name)
            for key in [k for k in self.queues if k[0] == entry.name]:
                self.queue_store.drop(self.queues.pop(key))
            # A re-created topic starts afresh: no offsets or unique keys of the old one apply.
            for offset_key in [k for k in self.offsets if k[1] == entry.name]:
                del self.offsets[offset_key]
            self.dedup.forget_topic(entry.name)
            self.pops.forget_topic(entry.name)
            return ApplyResult(index, "OK", topic=entry.name)
        if isinstance(entry, TimerDeliver):
            return self._deliver(index, position, entry)
        if isinstance(entry, TxnEnd):
            return apply_end(self, index, position, entry)
        if isinstance(entry, TxnCheck):
            for txn_id, checks in entry.checks:
                self.txns.count_check(txn_id, checks, entry.store_ts_ms)
            return ApplyResult(index, "OK")
        if isinstance(entry, LockQueues):
            if not entry.lock:
                self.locks.unlock(entry.group, entry.client_id, entry.queues, entry.store_ts_ms)
                return ApplyResult(index, "OK")
            granted = self.locks.lock(entry.group, entry.client_id, entry.queues,
                                      entry.store_ts_ms, entry.ttl_ms,
                                      fenced="lock_unfenced" not in self.config.canaries)
            return ApplyResult(index, "OK", granted=tuple(granted))
        if isinstance(entry, OffsetReset):
            return self._reset(index, entry)
        if isinstance(entry, (PopEntry, PopAck, PopChange, PopDead)):
            return apply_pop(self, index, position, entry)
        if isinstance(entry, AclPut):
            return ApplyResult(index, self.acl.put(entry.account))
        if isinstance(entry, AclDelete):
            return ApplyResult(index, self.acl.delete(entry.access_key))
        assert isinstance(entry, OffsetCommit)
        self.offsets[(entry.group, entry.topic, entry.queue_id)] = entry.offset
        self.pops.reset((entry.group, entry.topic, entry.queue_id), entry.offset)
        return ApplyResult(index, "OK", topic=entry.topic, queue_id=entry.queue_id)

    def _reset(self, index: int, e: OffsetReset) -> ApplyResult:
        """An admin's offset reset: every queue's offset set, or none (its topic is gone)."""
        cfg = self.topics.get(e.topic)
        if cfg is None:
            return ApplyResult(index, "TOPIC_NOT_FOUND", topic=e.topic)
        for queue_id, offset in e.offsets:
            self.offsets[(e.group, e.topic, queue_id)] = offset
            self.pops.reset((e.group, e.topic, queue_id), offset)
        return ApplyResult(index, "OK", topic=e.topic)

    def _send_runs(self, index: int, position: int, e: StoredRuns) -> ApplyResult:
        """Each run on its own, in order: a refused run (its topic missing, read-only, its queue
        beyond the topic's) stores nothing and leaves the others alone."""
        results = []
        slot = 0
        for run in e.runs:
            try:
                results.append(self._send(index, position, run, slot))
            except BrokerError as err:  # e.g. an auto-created topic's name is refused
                results.append(ApplyResult(index, err.code, run.topic, run.queue_id,
                                           detail=str(err), first_slot=slot))
            slot += len(run.messages)
        return ApplyResult(index, "SEND_OK", runs=tuple(results))

    def _send(self, index: int, position: int, e: StoredSend, first_slot: int = 0) -> ApplyResult:
        if e.topic == SCHEDULE_TOPIC:
            return self._schedule(index, position, e, first_slot)
        if e.topic == HALF_TOPIC:
            return apply_half(self, index, position, e, first_slot)
        topic = self.topics.get(e.topic)
        if topic is None:
            if not e.auto_create:
                return ApplyResult(index, "TOPIC_NOT_FOUND", topic=e.topic, first_slot=first_slot)
            topic = validate_config(TopicConfig(e.topic, e.default_queues, e.default_queues))
            self.topics[e.topic] = topic
        if not topic.writable:
            return ApplyResult(index, "NO_PERMISSION", topic=e.topic, first_slot=first_slot)
        if e.queue_id >= topic.write_queues:
            return ApplyResult(index, "QUEUE_NOT_FOUND", topic=e.topic, queue_id=e.queue_id,
                               first_slot=first_slot)
        self.dedup.expire(e.store_ts_ms)
        units = self.queue(e.topic, e.queue_id)
        offsets: list[int] = []
        dups: list[bool] = []
        qids: list[int] = []
        originals: list[tuple[int, int, int]] = []
        slot = first_slot
        dedup = self.dedup
        for body, tags, _, unique_key, _, _ in e.messages:
            seen = dedup.lookup_or_add(unique_key, e.topic, e.queue_id, len(units),
                                       e.store_ts_ms) if unique_key else None
            if seen is not None:
                offsets.append(seen[2])  # the original result; nothing stored again
                qids.append(seen[1])
                dups.append(True)
                originals.extend(self.original(len(offsets) - 1, e.topic, seen[1], seen[2]))
            else:
                offsets.append(len(units))
                qids.append(e.queue_id)
                dups.append(False)
                units.append(position, slot, len(body), tag_hash(tags), e.store_ts_ms)
            slot += 1
        return ApplyResult(index, "SEND_OK", e.topic, e.queue_id, tuple(offsets), tuple(dups),
                           tuple(qids), first_slot=first_slot, originals=tuple(originals))

    def queue(self, topic: str, queue_id: int) -> UnitQueue:
        """The queue, created (and numbered) if it is new."""
        units = self.queues.get((topic, queue_id))
        if units is None:
            units = self.queues[(topic, queue_id)] = self.queue_store.create(self.next_queue_no)
            self.next_queue_no += 1
        return units

    def original(self, k: int, topic: str, queue_id: int,
                 offset: int) -> list[tuple[int, int, int]]:
        """Where the message a duplicate repeats is stored: its consume-queue unit names its
        entry's position and its slot (the dedup table's (topic, queue, offset) lead there on
        every replica, and after a restore from any checkpoint version). A scheduled message's
        row holds its real queue id; its unit is in the one schedule queue. Empty if retention
        has deleted the unit (the answer then names the retry's own slot)."""
        qid = SCHEDULE_QUEUE if topic == SCHEDULE_TOPIC else HALF_QUEUE if topic == HALF_TOPIC \
            else queue_id
        try:
            unit = self.queues[(topic, qid)][offset]
        except (KeyError, IndexError):
            return []
        return [(k, unit.position, unit.slot)]

    def _schedule(self, index: int, position: int, e: StoredSend, first_slot: int) -> ApplyResult:
        """A run the leader rewrote for the schedule topic (``broker.features.delay.model``): each message
        stored in the schedule queue with a timer for its due time. The run answers with each
        message's real queue id (its queue offset is known only once delivered)."""
        try:
            timers = [timer_of(m) for m in e.messages]  # all or nothing: checked first
        except (ValueError, TypeError) as err:
            return ApplyResult(index, "BAD_ENTRY", e.topic, detail=str(err), first_slot=first_slot)
        self.dedup.expire(e.store_ts_ms)
        units = self.queue(SCHEDULE_TOPIC, SCHEDULE_QUEUE)
        offsets: list[int] = []
        dups: list[bool] = []
        qids: list[int] = []
        originals: list[tuple[int, int, int]] = []
        for k, (m, (_, real_qid, due_ms)) in enumerate(zip(e.messages, timers)):
            unique_key = m[3]
            seen = self.dedup.lookup_or_add(unique_key, SCHEDULE_TOPIC, real_qid, len(units),
                                            e.store_ts_ms) if unique_key else None
            if seen is not None:
                offsets.append(seen[2])
                qids.append(seen[1])
                dups.append(True)
                originals.extend(self.original(k, SCHEDULE_TOPIC, seen[1], seen[2]))
                continue
            offset = len(units)
            units.append(position, first_slot + k, len(m[0]), tag_hash(m[1]), e.store_ts_ms)
            self.timers.add(due_ms, offset)
            offsets.append(offset)
            qids.append(real_qid)
            dups.append(False)
        return ApplyResult(index, "SEND_OK", SCHEDULE_TOPIC, SCHEDULE_QUEUE, tuple(offsets),
                           tuple(dups), tuple(qids), first_slot=first_slot,
                           originals=tuple(originals))

    def _deliver(self, index: int, position: int, e: TimerDeliver) -> ApplyResult:
        """Due timers to their real queues: each one still pending is taken from the index and
        its copy (slot = its place in the entry) appended to its queue; one taken already (a
        second leader proposed it too) is skipped. A real topic deleted since is created again
        if the leader auto-creates topics, else the message is dropped with its topic; a queue
        beyond a topic shrunk since goes to queue (id mod write queues)."""
        woken: dict[tuple[str, int], ApplyResult] = {}
        redeliver = "timer_redeliver" in self.config.canaries
        for slot, (offset, due_ms, topic, qid, m) in enumerate(e.items):
            if not self.timers.take(offset, due_ms) and not redeliver:
                continue
            cfg = self.topics.get(topic)
            if cfg is None and e.auto_create:
                try:
                    cfg = self.topics[topic] = validate_config(
                        TopicConfig(topic, e.default_queues, e.default_queues), allow_system=True)
                except BrokerError:
                    cfg = None
            if cfg is None or cfg.write_queues == 0:
                continue
            qid %= cfg.write_queues
            self.queue(topic, qid).append(position, slot, len(m[0]), tag_hash(m[1]), e.store_ts_ms)
            woken[(topic, qid)] = ApplyResult(index, "SEND_OK", topic, qid)
        return ApplyResult(index, "SEND_OK", runs=tuple(woken.values()))

    # -- reads ----------------------------------------------------------------------------------

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min offset, max offset) of a queue: max is the next offset to be assigned; min the
        oldest the queue still holds (retention may have deleted older units' files)."""
        units = self.queues.get((topic, queue_id))
        return (units.first(), len(units)) if units is not None else (0, 0)

    def offset_at(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first offset of a queue stored at or after ``timestamp_ms`` (the max offset when
        none is). Store times follow log order, as the leaders' clocks do (RocketMQ searches the
        same way)."""
        units = self.queues.get((topic, queue_id))
        if units is None:
            return 0
        return bisect.bisect_left(units, timestamp_ms, lo=units.first(),
                                  key=lambda u: u.store_ts_ms)

    def units(self, topic: str, queue_id: int, offset: int, count: int) -> list[CQUnit]:
        units = self.queues.get((topic, queue_id))
        return units[offset : offset + count] if units is not None else []

    # -- checkpoint ------------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """Everything, in a canonical order: equal states give equal bytes."""
        return cbor2.dumps([
            CHECKPOINT_VERSION, self.applied_index,
            sorted([t.name, t.read_queues, t.write_queues, t.perm] for t in self.topics.values()),
            sorted([t, q, units.no, self.queue_store.record(units)]
                   for (t, q), units in self.queues.items()),
            sorted([g, t, q, o] for (g, t, q), o in self.offsets.items()),
            self.dedup.snapshot(),
            [self.timers.snapshot(), self.locks.snapshot(), self.txns.snapshot(),
             self.pops.snapshot(), self.acl.snapshot()],
            self.next_queue_no,
        ])

    @staticmethod
    def applied_of(blob: bytes) -> int:
        """The applied index a checkpoint holds (nothing else restored)."""
        fields = _load(blob)
        if not (isinstance(fields, list) and len(fields) > 1 and isinstance(fields[1], int)):
            raise BadEntryError("malformed checkpoint")
        return fields[1]

    @classmethod
    def restore(cls, blob: bytes, config: StateConfig | None = None,
                queue_store: QueueStore | None = None) -> BrokerState:
        try:
            fields = _load(blob)
            version = fields[0] if isinstance(fields, list) and fields else None
            if version not in READ_VERSIONS:
                raise BadEntryError(f"unknown checkpoint version {version!r}")
            version, applied, topics, queues, offsets, dedup, *rest = fields
            if len(rest) != (2 if version >= 5 else 1 if version >= 3 else 0):
                raise ValueError(f"a version {version} checkpoint has {len(fields)} fields")
            state = cls(config or StateConfig(), applied)
            if queue_store is not None:
                state.queue_store = queue_store
            state.topics = {n: TopicConfig(n, r, w, p) for n, r, w, p in topics}
            _restore_queues(state, version, queues, rest[1] if version >= 5 else None)
            state.offsets = {(g, t, q): o for g, t, q, o in offsets}
            cfg = state.config
            if rest:
                timers, locks, *more = rest[0]
                if len(more) != (3 if version >= 7 else 2 if version >= 6 else 1 if version >= 4
                                 else 0):
                    raise ValueError(f"a version {version} checkpoint's feature state is short")
                state.timers = DelayIndex.restore(timers)
                state.locks = LockTable.restore(locks)
                if more:
                    state.txns = TxnTable.restore(more[0])
                if len(more) > 1:
                    state.pops = PopTable.restore(more[1], cfg.canaries & POP_CANARIES)
                if len(more) > 2:
                    state.acl = AclTable.restore(more[2])
            window, bound = cfg.dedup_window_ms, cfg.dedup_entries_max
            state.dedup = (DedupTable.restore(window, bound, dedup) if version >= 5
                           else DedupTable.from_rows(window, bound, _old_dedup_rows(version, dedup)))
        except (TypeError, ValueError, struct.error) as err:
            raise BadEntryError(f"malformed checkpoint: {err}") from err
        return state


def _restore_queues(state: BrokerState, version: int, queues: Any, next_no: Any) -> None:
    store = state.queue_store
    if version >= 5:
        if not isinstance(next_no, int):
            raise ValueError("malformed queue count")
        state.queues = {(t, q): store.restore(no, record) for t, q, no, record in queues}
        state.next_queue_no = next_no
        return
    for no, (t, q, units) in enumerate(queues):  # earlier versions held the units themselves
        if version == 1:  # each unit a list
            packed = b"".join(UNIT.pack(*u) for u in units)
        elif isinstance(units, bytes):
            packed = units
        else:
            raise ValueError("consume queue must be packed units")
        state.queues[(t, q)] = store.from_packed(no, packed)
    state.next_queue_no = len(queues)


OLD_DEDUP_ROW = struct.Struct("<IQQ")  # versions 2-4: queue id, queue offset, store time (ms)


def _old_dedup_rows(version: int, blob: Any) -> list[tuple[str, str, int, int, int]]:
    """An earlier version's dedup table as (key, topic, queue id, offset, time) rows, oldest
    first (a key's later row wins when they are remembered again in order)."""
    if version == 1:
        return [(k, t, q, o, ts) for k, t, q, o, ts in blob]
    keys, topics, rows = blob
    if not (isinstance(keys, list) and isinstance(topics, list) and isinstance(rows, bytes)
            and len(keys) == len(topics) and len(rows) == len(keys) * OLD_DEDUP_ROW.size):
        raise ValueError("malformed dedup table")
    return [(k, t, *r) for k, t, r in zip(keys, topics, OLD_DEDUP_ROW.iter_unpack(rows))]


def _load(blob: bytes) -> Any:
    try:
        return cbor2.loads(blob)
    except Exception as err:  # noqa: BLE001 - any decode failure is a corrupt checkpoint
        raise BadEntryError(f"corrupt checkpoint: {err}") from err
