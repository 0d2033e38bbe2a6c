"""The registry of log entry kinds: each kind says once how it is encoded, decoded and applied.

An ``EntryKind`` names its numbers in the envelope (``broker.core.codec``), the Python types that
stand for it, its encoder and decoder, the form the replicas apply (when it differs: a send's
messages stay in entry form), its apply, and, for a kind that stores messages, what it stores
(for the key index and message query) and its messages by slot (for reads by position and
slot). An ``EntryRegistry`` is built from the kinds of the core and of every feature
(``broker.machine.kinds`` lists them, in one place) and refuses two kinds with one number or
type. Dispatch is by type and by number, never by a chain of isinstance tests. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from broker.core.applied import ApplyResult
from broker.core.codec import envelope
from protocol.broker_errors import BadEntryError

__all__ = ["EntryKind", "EntryRegistry", "StoredRun", "StoredTopics", "message_at"]

# What an entry that stores messages stores: its store time and its runs of messages,
# (topic, queue id, [message in entry form...]), slots counting on across the runs.
StoredRun = tuple[str, int, list[Any]]
StoredTopics = tuple[int, list[StoredRun]]
Apply = Callable[[Any, int, int, Any], ApplyResult]  # (state, index, position, entry)


@dataclass(frozen=True, slots=True)
class EntryKind:
    name: str
    numbers: tuple[int, ...]
    types: tuple[type, ...]  # what it encodes and applies (the decoded and the applied forms)
    encode: Callable[[Any], bytes]
    decode: Callable[[int, list[Any]], Any]  # (number, fields after it) -> entry
    apply: Apply
    decode_applied: Callable[[int, list[Any]], Any] | None = None  # refuses what decode refuses
    stored: Callable[[Any], StoredTopics] | None = None  # of the applied form
    messages: Callable[[list[Any]], list[Any]] | None = None  # from the fields, by slot


class EntryRegistry:
    def __init__(self, kinds: Iterable[EntryKind]) -> None:
        self.kinds = tuple(kinds)
        self._by_number: dict[int, EntryKind] = {}
        self._by_type: dict[type, EntryKind] = {}
        for kind in self.kinds:
            for number in kind.numbers:
                if number in self._by_number:
                    raise ValueError(f"entry kind {number} is both {self._by_number[number].name} "
                                     f"and {kind.name}")
                self._by_number[number] = kind
            for typ in kind.types:
                if typ in self._by_type:
                    raise ValueError(f"{typ.__name__} belongs to {self._by_type[typ].name} "
                                     f"and {kind.name}")
                self._by_type[typ] = kind

    def encode(self, entry: object) -> bytes:
        kind = self._by_type.get(type(entry))
        if kind is None:
            raise TypeError(f"not a broker entry: {entry!r}")
        return kind.encode(entry)

    def _kind_of(self, number: Any) -> EntryKind:
        kind = self._by_number.get(number) if isinstance(number, int) else None
        if kind is None:
            raise BadEntryError(f"unknown broker entry kind {number!r}")
        return kind

    def decode(self, payload: bytes) -> Any:
        number, rest = envelope(payload)
        kind = self._kind_of(number)
        try:
            return kind.decode(number, rest)
        except (TypeError, ValueError) as err:
            raise BadEntryError(f"malformed entry of kind {number}: {err}") from err

    def decode_for_apply(self, payload: bytes) -> Any:
        """As ``decode``, refusing exactly the same payloads, in the form the kind applies."""
        number, rest = envelope(payload)
        kind = self._kind_of(number)
        try:
            return (kind.decode_applied or kind.decode)(number, rest)
        except (TypeError, ValueError) as err:
            raise BadEntryError(f"malformed entry of kind {number}: {err}") from err

    def apply(self, state: Any, index: int, position: int, entry: object) -> ApplyResult:
        kind = self._by_type.get(type(entry))
        if kind is None:
            raise TypeError(f"not a broker entry: {entry!r}")
        return kind.apply(state, index, position, entry)

    def stored_topics(self, entry: object) -> StoredTopics | None:
        """(store time, [(topic, queue id, [message...])...]) of an entry as ``decode_for_apply``
        gives it, None for one that stores no message. A message listed may still have been
        refused at apply (a duplicate, a timer delivered already): the consume queues say which
        were stored."""
        kind = self._by_type.get(type(entry))
        return kind.stored(entry) if kind is not None and kind.stored is not None else None

    def stored_messages(self, payload: bytes) -> list[Any]:
        """The messages of an applied entry in entry form, indexed by slot (for reads of entries
        the state machine stored: ``decode_for_apply`` checked them then)."""
        number, rest = envelope(payload)
        kind = self._by_number.get(number) if isinstance(number, int) else None
        if kind is None or kind.messages is None:
            raise BadEntryError(f"entry of kind {number!r} holds no messages")
        return kind.messages(rest)


def message_at(stored: StoredTopics, slot: int) -> StoredRun | None:
    """(topic, queue id, message) at ``slot`` of what an entry stores, or None past its end."""
    for topic, qid, messages in stored[1]:
        if slot < len(messages):
            return topic, qid, messages[slot]
        slot -= len(messages)
    return None
