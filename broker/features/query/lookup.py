"""Message query on a broker node: by offset msg id, by key within a time range, by unique key,
by topic within a time range (no key: from the topic's consume queues, newest first).

Owns turning an index hit (commitlog position and slot) into a stored message, and the checks
that make a hit one: the message read from the log has the key asked for (a hash may collide),
and a consume queue holds it at that position and slot (a duplicate the dedup table refused,
a timer delivered twice, and a schedule-topic copy are in the log but not stored as messages
of the topic asked for). Answers with the message's queue and offset and the consumer groups
whose committed offset is past it. Reads the log (a ``pread`` per entry) and the state machine
of this node: a follower answers from what it has applied, which may lag its leader.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from broker.core.consumequeue import CQUnit, UnitQueue
from broker.core.registry import StoredTopics, message_at
from broker.features.delay.model import SCHEDULE_QUEUE, SCHEDULE_TOPIC
from broker.features.host import BrokerHost
from broker.features.query.index import KeyIndex, key_hash, unique_hash
from protocol.broker_errors import BadEntryError, MessageNotFoundError
from protocol.broker_kinds import message_id, offset_msg_id, parse_offset_msg_id, unscoped
from protocol.errors import DLedgerError

QUERY_MESSAGES_MAX = 1024  # messages one query answers at most


class LookupHost(BrokerHost, Protocol):
    @property
    def index(self) -> KeyIndex: ...


class Lookup:
    """One query's reads: each log entry decoded once."""

    def __init__(self, host: LookupHost) -> None:
        self.host = host
        self._entries: dict[int, StoredTopics | None] = {}

    def _at(self, position: int, slot: int) -> tuple[int, str, int, list[Any]] | None:
        """(store time, topic, queue id, message) of the log's message at (position, slot)."""
        if position not in self._entries:
            store = self.host.node.store
            try:
                assert store is not None
                registry = self.host.state.registry
                self._entries[position] = registry.stored_topics(
                    registry.decode_for_apply(store.read_at(position).data))
            except (DLedgerError, IndexError, BadEntryError):  # retained away, or no entry there
                self._entries[position] = None
        stored = self._entries[position]
        found = message_at(stored, slot) if stored is not None else None
        return None if found is None or stored is None else (stored[0], *found)

    def view(self, offset_id: str) -> list[Any]:
        group, position, slot = parse_offset_msg_id(offset_id)
        if group != self.host.group:
            raise MessageNotFoundError(f"{offset_id}: a message of group {group}, not of "
                                       f"{self.host.group}")
        row = self.row(position, slot)
        if row is None:
            raise MessageNotFoundError(f"{offset_id}: no message is stored there on "
                                       f"{self.host.group} (or no longer: log retention)")
        return row

    def by_key(self, topic: str, key: str, begin_ms: int, end_ms: int,
               max_messages: int) -> list[list[Any]]:
        return self._collect(key_hash(topic, key), begin_ms, end_ms, max_messages,
                             lambda t, m: t == topic and key in m[2])

    def by_unique_key(self, unique_key: str, topic: str, max_messages: int) -> list[list[Any]]:
        return self._collect(unique_hash(unique_key), 0, 2**63 - 1, max_messages,
                             lambda t, m: unique_key in (m[3], message_id(m[3], m[4]))
                             and (not topic or t == topic))

    def by_time(self, topic: str, begin_ms: int, end_ms: int,
                max_messages: int) -> list[list[Any]]:
        """The newest ``max_messages`` of the topic stored within [begin_ms, end_ms], newest
        first: each queue walked back from the range's end (store times follow the log), the
        queues merged, so at most ``max_messages`` units are read past one per queue."""
        def newest_first(units: UnitQueue) -> Iterator[tuple[int, int, int]]:
            lo = bisect.bisect_left(units, begin_ms, lo=units.first(), key=_store_ts)
            hi = bisect.bisect_right(units, end_ms, lo=lo, key=_store_ts)
            for k in range(hi - 1, lo - 1, -1):
                u = units[k]
                yield -u.store_ts_ms, u.position, u.slot
        runs = [newest_first(units) for (t, _), units in self.host.state.queues.items()
                if t == topic]
        out: list[list[Any]] = []
        for _, position, slot in heapq.merge(*runs):
            if len(out) >= max_messages:
                break
            row = self.row(position, slot)
            if row is not None:
                out.append(row)
        return out

    def _collect(self, h: int, begin_ms: int, end_ms: int, max_messages: int,
                 wanted: Any) -> list[list[Any]]:
        out: list[list[Any]] = []
        seen: set[tuple[int, int]] = set()
        for position, slot, _ in self.host.index.candidates(h, begin_ms, end_ms):
            if len(out) >= max_messages:
                break
            if (position, slot) in seen:
                continue
            seen.add((position, slot))
            at = self._at(position, slot)
            if at is not None and wanted(at[1], at[3]):
                row = self.row(position, slot)
                if row is not None:
                    out.append(row)
        return out

    def row(self, position: int, slot: int) -> list[Any] | None:
        """The message stored at (position, slot) as the wire has it, or None if no consume
        queue holds it: ``[offset_msg_id, group, topic, queue_id, queue_offset, body, tags,
        keys, unique_key, [[name, value]...], born_ts_ms, store_ts_ms, [consumer group...]]``."""
        at = self._at(position, slot)
        if at is None:
            return None
        store_ts, topic, qid, m = at
        where = self.queue_of(topic, qid, position, slot)
        if where is None:
            return None
        qid, offset = where
        body, tags, keys, unique_key, props, born = m
        return [offset_msg_id(self.host.group, position, slot), self.host.group, topic, qid,
                offset, body, tags, list(keys), unscoped(unique_key), [list(p) for p in props], born,
                store_ts, self.consumed_by(topic, qid, offset)]

    def queue_of(self, topic: str, qid: int, position: int, slot: int) -> tuple[int, int] | None:
        """(queue id, queue offset) of the unit naming (position, slot) in one of the topic's
        queues: the entry's queue first (a delivered timer's may have been taken modulo the
        topic's write queues), then any other."""
        state = self.host.state
        if topic == SCHEDULE_TOPIC:
            order: Iterable[int] = [SCHEDULE_QUEUE]
        else:
            cfg = state.topics.get(topic)
            first = [qid] + ([qid % cfg.write_queues] if cfg and cfg.write_queues else [])
            order = dict.fromkeys([*first, *sorted(q for t, q in state.queues if t == topic)])
        for q in order:
            units = state.queues.get((topic, q))
            if units is None:
                continue
            k = bisect.bisect_left(units, position, lo=units.first(), key=lambda u: u.position)
            while k < len(units):
                u = units[k]
                if u.position != position:
                    break
                if u.slot == slot:
                    return q, k
                k += 1
        return None

    def consumed_by(self, topic: str, qid: int, offset: int) -> list[str]:
        """Consumer groups whose committed offset on the queue is past ``offset``."""
        return sorted(g for (g, t, q), o in self.host.state.offsets.items()
                      if t == topic and q == qid and o > offset)


def _store_ts(u: CQUnit) -> int:
    return u.store_ts_ms
