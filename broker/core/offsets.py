"""Consumer groups' committed offsets: (consumer group, topic, queue id) -> the next offset to
consume, as a mapping (``CoreState.offsets``), kept compactly.

A group commits an offset for each queue of each topic it consumes, so the offsets come in rows:
one array of 64-bit integers per (group, topic), indexed by queue id, -1 where the group has
committed nothing. A row costs its (group, topic) key once and 8 bytes per queue, where a dict
of (group, topic, queue id) tuples cost a tuple, an int and a table slot per offset (about 420
bytes each, measured at 1,000 groups of 40 queues). A key outside a row's reach (a queue id
outside 0..MAX_QUEUES - 1, an offset below 0 or past 64 bits: nothing a broker proposes, but the
apply takes what the log holds) goes into a plain dict beside the rows, so the mapping holds
exactly what it is given, on every replica alike.

Iteration is row by row in the order each (group, topic) was first set, queue ids ascending
within a row: the same on every replica, as a dict's insertion order was.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, MutableMapping

from protocol.topics import MAX_QUEUES

OffsetKey = tuple[str, str, int]  # (consumer group, topic, queue id)
NONE = -1  # a row's slot of a queue the group has committed nothing for
OFFSET_MAX = 2**63 - 1


class OffsetTable(MutableMapping[OffsetKey, int]):
    """(group, topic, queue id) -> committed offset, in rows of 64-bit offsets."""

    __slots__ = ("_rows", "_odd", "_count")

    def __init__(self, items: Iterable[tuple[OffsetKey, int]] = ()) -> None:
        self._rows: dict[tuple[str, str], array[int]] = {}
        self._odd: dict[OffsetKey, int] = {}  # keys or offsets a row cannot hold
        self._count = 0  # offsets held in rows
        for key, offset in items:
            self[key] = offset

    @staticmethod
    def _fits(queue_id: int, offset: int) -> bool:
        return 0 <= queue_id < MAX_QUEUES and 0 <= offset <= OFFSET_MAX

    def __getitem__(self, key: OffsetKey) -> int:
        group, topic, queue_id = key
        row = self._rows.get((group, topic))
        if row is not None and 0 <= queue_id < len(row) and row[queue_id] != NONE:
            return row[queue_id]
        return self._odd[key]

    def __setitem__(self, key: OffsetKey, offset: int) -> None:
        group, topic, queue_id = key
        if not self._fits(queue_id, offset):
            self._remove_from_row(key)
            self._odd[key] = offset
            return
        if self._odd:
            self._odd.pop(key, None)
        row = self._rows.get((group, topic))
        if row is None:
            row = self._rows[(group, topic)] = array("q")
        if queue_id >= len(row):
            row.extend([NONE] * (queue_id + 1 - len(row)))
        if row[queue_id] == NONE:
            self._count += 1
        row[queue_id] = offset

    def __delitem__(self, key: OffsetKey) -> None:
        if not self._remove_from_row(key):
            del self._odd[key]

    def _remove_from_row(self, key: OffsetKey) -> bool:
        group, topic, queue_id = key
        row = self._rows.get((group, topic))
        if row is None or not 0 <= queue_id < len(row) or row[queue_id] == NONE:
            return False
        row[queue_id] = NONE
        self._count -= 1
        if all(o == NONE for o in row):
            del self._rows[(group, topic)]
        return True

    def __iter__(self) -> Iterator[OffsetKey]:
        for (group, topic), row in list(self._rows.items()):
            for queue_id, offset in enumerate(row):
                if offset != NONE:
                    yield group, topic, queue_id
        yield from list(self._odd)

    def __len__(self) -> int:
        return self._count + len(self._odd)

    def __repr__(self) -> str:
        return f"OffsetTable({dict(self.items())!r})"


__all__ = ["OffsetKey", "OffsetTable"]
