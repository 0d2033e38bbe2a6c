"""What a read of a queue passes over, shared by PULL (``broker.api.broker``) and POP
(``broker.features.pop.scan``): a unit whose tag hash the reader did not ask for (``*`` or no
tags: any), a message whose tag is not one asked for (POP only: a pull's client checks tags
exactly itself, as RocketMQ's do), one that does not match the reader's SQL92 filter (the
broker's alone: the client trusts it), and one whose TTL has passed by this node's clock
(``protocol.message_ttl``; counted in ``expired``). Pure: the clock is read by the caller."""

from __future__ import annotations

from typing import Any, Protocol

from broker.core.applied import tag_hash
from broker.core.codec import Message
from broker.core.consumequeue import CQUnit
from protocol.filter_sql import SqlFilter
from protocol.message_ttl import expired

__all__ = ["MessageReader", "ReadFilter"]


class MessageReader(Protocol):
    def read_message(self, position: int, slot: int, entries: dict[int, list[Any]]) -> Message: ...


class ReadFilter:
    """A read's filter (tags, SQL92) and the reading node's clock for TTLs."""

    __slots__ = ("tags", "wanted", "exact_tags", "sql", "now_ms", "expired", "ttl")

    def __init__(self, tags: list[str], sql: SqlFilter | None, now_ms: int, *,
                 exact_tags: bool, ttl: bool = True) -> None:
        self.tags = tags
        self.wanted = {tag_hash(t) for t in tags if t != "*"} \
            if tags and "*" not in tags else None
        self.exact_tags = exact_tags
        self.sql, self.now_ms, self.expired = sql, now_ms, 0
        self.ttl = ttl  # False only under the seeded bug ttl_ignored (POP)

    def examine(self, reader: MessageReader, unit: CQUnit, entries: dict[int, list[Any]]
                ) -> Message | None:
        """The unit's message (read through ``entries``, each entry decoded once per read), or
        None if the read passes it."""
        if self.wanted is not None and unit.tag_hash not in self.wanted:
            return None
        m = reader.read_message(unit.position, unit.slot, entries)
        if (self.exact_tags and self.wanted is not None and m.tags not in self.tags) or \
                (self.sql is not None and not self.sql.matches(dict(m.properties), m.tags)):
            return None
        if self.ttl and m.properties and expired(m.properties, unit.store_ts_ms, self.now_ms):
            self.expired += 1
            return None
        return m
