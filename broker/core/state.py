"""The core of the broker's state machine: applied to committed log entries in log order, on every
replica. Owns topics, consume queues (per (topic, queue): packed units pointing into the
commitlog, RocketMQ's 20-byte idea: position, size, tag hash, plus the slot within a batch entry
and the store time; see ``consumequeue``), consumer-group offsets, the dedup table of unique keys
(``dedup``), and the features' parts of the state, each kept under its name.

Queue offsets are assigned here, at apply time, so every replica derives the same
(topic, queue, offset) -> message mapping forever. Storing a run of messages with its dedup
check is written once (``store``): sends, delayed and half messages all go through it. An entry
is decoded and applied through the registry (``broker.core.registry``); a send to a topic a
feature owns (the schedule topic, the half topic) goes to that feature's apply
(``topic_routes``). Pure and deterministic: no clock (times come from the entries), no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from broker.core.applied import ApplyResult, tag_hash
from broker.core.consumequeue import UNIT, CQUnit, MemoryQueues, QueueStore, UnitQueue
from broker.core.dedup import DedupTable
from broker.core.entries import (
    KIND_OFFSET_COMMIT,
    KIND_SEND,
    KIND_SEND_RUNS,
    KIND_TOPIC_DELETE,
    KIND_TOPIC_PUT,
    OffsetCommit,
    SendEntry,
    SendRunsEntry,
    StoredRuns,
    StoredSend,
    TopicDelete,
    TopicPut,
    decode_offset_commit,
    decode_runs,
    decode_runs_applied,
    decode_send,
    decode_send_applied,
    decode_topic_delete,
    decode_topic_put,
    encode_offset_commit,
    encode_runs_entry,
    encode_send_entry,
    encode_topic_delete,
    encode_topic_put,
    runs_messages,
    send_messages,
)
from broker.core.offsets import OffsetKey, OffsetTable
from broker.core.registry import EntryKind, EntryRegistry, StoredTopics
from protocol.broker_errors import BadEntryError, BrokerError
from protocol.topics import TopicConfig, validate_config

__all__ = ["CORE_KINDS", "CoreState", "Part", "StateConfig", "TopicRoute", "apply_offset_commit",
           "apply_runs", "apply_send", "apply_topic_delete", "apply_topic_put"]

P = TypeVar("P")
# A send to a topic a feature owns: (state, index, position, run, first slot) -> its result
TopicRoute = Callable[[Any, int, int, StoredSend, int], ApplyResult]


# Seeded bug (tests only): "dedup_ignored" stores a retried send again, as if its unique key had
# never been seen (the dedup table is still kept): a send whose first try was stored, its answer
# lost with a killed leader, is stored twice by the library's retry.
DEDUP_CANARIES = frozenset({"dedup_ignored"})


@dataclass(frozen=True)
class StateConfig:
    dedup_window_ms: int = 10 * 60 * 1000  # a retried send within this window is not stored again
    dedup_entries_max: int = 1_000_000
    # Seeded bugs (tests only, on every replica alike); each feature names its own
    # (broker.machine.state.STATE_CANARIES lists them).
    canaries: frozenset[str] = frozenset()


class Part(Protocol):
    """A feature's part of the state: kept under the feature's name in checkpoints."""

    def snapshot(self) -> Any: ...


@dataclass
class CoreState:
    config: StateConfig = field(default_factory=StateConfig)
    registry: EntryRegistry = field(default_factory=lambda: EntryRegistry(()), repr=False)
    applied_index: int = 0
    topics: dict[str, TopicConfig] = field(default_factory=dict)
    queues: dict[tuple[str, int], UnitQueue] = field(default_factory=dict)
    next_queue_no: int = 0  # numbers queues in the order they are created (names their files)
    offsets: OffsetTable = field(default_factory=OffsetTable)  # (broker.core.offsets)
    # unique key -> (topic, queue id, queue offset, store time), oldest first
    dedup: DedupTable = field(init=False)
    # The entry ``apply`` last decoded (None: a no-op or a malformed one), for derived data
    # such as the key index (``broker.features.query.index``) that would otherwise decode it again.
    last_entry: object = field(default=None, compare=False, repr=False)
    # Where queues keep their units: in memory (the default), or in files (a broker process).
    queue_store: QueueStore = field(default_factory=MemoryQueues, compare=False, repr=False)
    parts: dict[str, Part] = field(default_factory=dict, compare=False, repr=False)
    topic_routes: dict[str, TopicRoute] = field(default_factory=dict, compare=False, repr=False)
    # Called when a topic is deleted / a group's offset is set by a commit or a reset.
    on_topic_deleted: list[Callable[[str], None]] = field(default_factory=list, compare=False,
                                                          repr=False)
    on_offset_set: list[Callable[[OffsetKey, int], None]] = field(default_factory=list,
                                                                 compare=False, repr=False)

    def __post_init__(self) -> None:
        self.dedup = DedupTable(self.config.dedup_window_ms, self.config.dedup_entries_max)

    def part(self, name: str, kind: type[P]) -> P:
        """The feature part kept under ``name`` (of type ``kind``)."""
        found = self.parts[name]
        assert isinstance(found, kind), (name, type(found))
        return found

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
            entry = self.last_entry = self.registry.decode_for_apply(data)
        except BadEntryError as err:
            return ApplyResult(index, "BAD_ENTRY", detail=str(err))
        try:
            return self.registry.apply(self, index, position, entry)
        except BrokerError as err:
            return ApplyResult(index, err.code, detail=str(err))

    def set_offset(self, key: OffsetKey, offset: int) -> None:
        """A consumer group's offset set by a commit or a reset (the features hear of it)."""
        self.offsets[key] = offset
        for hook in self.on_offset_set:
            hook(key, offset)

    def store(self, index: int, position: int, topic: str, queue_id: int,
              messages: Sequence[list[Any]], store_ts_ms: int, first_slot: int,
              real_qids: Sequence[int] | None = None,
              stored: Callable[[int, int], None] | None = None) -> ApplyResult:
        """Store a run of messages (entry form) in queue (topic, queue_id): each one whose unique
        key was stored within the dedup window is not stored again and answers with the original
        (its queue offset and, in ``originals``, where it is). ``real_qids``: per message, the
        queue id its dedup row and answer name (a delayed or half message's real queue; default
        ``queue_id``). ``stored(k, offset)`` is told of each message stored. Slots number the
        messages from ``first_slot``."""
        self.dedup.expire(store_ts_ms)
        units = self.queue(topic, queue_id)
        offsets: list[int] = []
        dups: list[bool] = []
        qids: list[int] = []
        originals: list[tuple[int, int, int]] = []
        found: list[tuple[str, int, int, int] | None] = []  # per message: its original's row
        pack, packed = UNIT.pack, bytearray()  # the run's units, appended to the queue at once
        offset = len(units)  # the next message's
        try:  # (a key the table refuses leaves what the keys before it decided, as one by one)
            self.dedup.lookup_or_add_run([m[3] for m in messages], topic, queue_id, real_qids,
                                         offset, store_ts_ms, found,
                                         dups="dedup_ignored" not in self.config.canaries)
        finally:
            try:
                for k, seen in enumerate(found):
                    if seen is not None:
                        offsets.append(seen[2])  # the original result; nothing stored again
                        qids.append(seen[1])
                        dups.append(True)
                        units.append_packed(packed)  # (the original may be one of this run's)
                        packed.clear()
                        originals.extend(self.original(k, topic, seen[1], seen[2]))
                        continue
                    m = messages[k]
                    packed += pack(position, first_slot + k, len(m[0]), tag_hash(m[1]),
                                   store_ts_ms)
                    offsets.append(offset)
                    qids.append(queue_id if real_qids is None else real_qids[k])
                    dups.append(False)
                    if stored is not None:
                        stored(k, offset)
                    offset += 1
            finally:
                units.append_packed(packed)
        return ApplyResult(index, "SEND_OK", topic, queue_id, tuple(offsets), tuple(dups),
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
        every replica, and after a restore from any checkpoint version). A message of a topic a
        feature owns is in that topic's one queue (0), its row holding its real queue id. Empty
        if retention has deleted the unit (the answer then names the retry's own slot)."""
        qid = 0 if topic in self.topic_routes else queue_id
        try:
            unit = self.queues[(topic, qid)][offset]
        except (KeyError, IndexError):
            return []
        return [(k, unit.position, unit.slot)]

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


# -- the core kinds' apply ------------------------------------------------------------------------

def apply_send(state: CoreState, index: int, position: int, e: StoredSend,
               first_slot: int = 0) -> ApplyResult:
    route = state.topic_routes.get(e.topic)
    if route is not None:
        return route(state, index, position, e, first_slot)
    topic = state.topics.get(e.topic)
    if topic is None:
        if not e.auto_create:
            return ApplyResult(index, "TOPIC_NOT_FOUND", topic=e.topic, first_slot=first_slot)
        topic = validate_config(TopicConfig(e.topic, e.default_queues, e.default_queues))
        state.topics[e.topic] = topic
    if not topic.writable:
        return ApplyResult(index, "NO_PERMISSION", topic=e.topic, first_slot=first_slot)
    if e.queue_id >= topic.write_queues:
        return ApplyResult(index, "QUEUE_NOT_FOUND", topic=e.topic, queue_id=e.queue_id,
                           first_slot=first_slot)
    return state.store(index, position, e.topic, e.queue_id, e.messages, e.store_ts_ms,
                       first_slot)


def apply_runs(state: CoreState, index: int, position: int, e: StoredRuns) -> ApplyResult:
    """Each run on its own, in order: a refused run (its topic missing, read-only, its queue
    beyond the topic's) stores nothing and leaves the others alone."""
    results = []
    slot = 0
    for run in e.runs:
        try:
            results.append(apply_send(state, index, position, run, slot))
        except BrokerError as err:  # e.g. an auto-created topic's name is refused
            results.append(ApplyResult(index, err.code, run.topic, run.queue_id,
                                       detail=str(err), first_slot=slot))
        slot += len(run.messages)
    return ApplyResult(index, "SEND_OK", runs=tuple(results))


def apply_topic_put(state: CoreState, index: int, position: int, e: TopicPut) -> ApplyResult:
    cfg = validate_config(TopicConfig(e.name, e.read_queues, e.write_queues, e.perm),
                          allow_system=e.system)
    state.topics[cfg.name] = cfg
    return ApplyResult(index, "OK", topic=cfg.name)


def apply_topic_delete(state: CoreState, index: int, position: int,
                       e: TopicDelete) -> ApplyResult:
    if state.topics.pop(e.name, None) is None:
        return ApplyResult(index, "TOPIC_NOT_FOUND", topic=e.name)
    for key in [k for k in state.queues if k[0] == e.name]:
        state.queue_store.drop(state.queues.pop(key))
    # A re-created topic starts afresh: no offsets or unique keys of the old one apply.
    for offset_key in [k for k in state.offsets if k[1] == e.name]:
        del state.offsets[offset_key]
    state.dedup.forget_topic(e.name)
    for hook in state.on_topic_deleted:
        hook(e.name)
    return ApplyResult(index, "OK", topic=e.name)


def apply_offset_commit(state: CoreState, index: int, position: int,
                        e: OffsetCommit) -> ApplyResult:
    state.set_offset((e.group, e.topic, e.queue_id), e.offset)
    return ApplyResult(index, "OK", topic=e.topic, queue_id=e.queue_id)


def _stored_send(e: StoredSend) -> StoredTopics:
    return e.store_ts_ms, [(e.topic, e.queue_id, e.messages)]


def _stored_runs(e: StoredRuns) -> StoredTopics:
    return e.store_ts_ms, [(r.topic, r.queue_id, r.messages) for r in e.runs]


CORE_KINDS = (
    EntryKind("send", (KIND_SEND,), (SendEntry, StoredSend), encode_send_entry, decode_send,
              apply_send, decode_applied=decode_send_applied, stored=_stored_send,
              messages=send_messages),
    EntryKind("topic_put", (KIND_TOPIC_PUT,), (TopicPut,), encode_topic_put, decode_topic_put,
              apply_topic_put),
    EntryKind("topic_delete", (KIND_TOPIC_DELETE,), (TopicDelete,), encode_topic_delete,
              decode_topic_delete, apply_topic_delete),
    EntryKind("offset_commit", (KIND_OFFSET_COMMIT,), (OffsetCommit,), encode_offset_commit,
              decode_offset_commit, apply_offset_commit),
    EntryKind("send_runs", (KIND_SEND_RUNS,), (SendRunsEntry, StoredRuns), encode_runs_entry,
              decode_runs, apply_runs, decode_applied=decode_runs_applied, stored=_stored_runs,
              messages=runs_messages),
)
