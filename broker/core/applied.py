"""What applying one entry did (``ApplyResult``), and the tag code stored in consume-queue units:
shared by the state machine (``broker.core.state``), its feature parts and the send path's answers."""

from __future__ import annotations

import zlib
from dataclasses import dataclass


@dataclass(slots=True)
class ApplyResult:
    """What applying one entry did. ``status`` is SEND_OK, or the error every replica reached.
    A multi-run send entry's result has one result per run in ``runs`` (each SEND_OK or the
    run's own refusal); a send entry's result is its only run's. A value, never changed once
    made (not a frozen dataclass: one is made per run applied, and a frozen one's constructor
    cost four times as much, 1.1 us)."""

    index: int
    status: str
    topic: str = ""
    queue_id: int = 0
    queue_offsets: tuple[int, ...] = ()  # per message of a send, in order
    duplicates: tuple[bool, ...] = ()  # per message: stored earlier under the same unique key
    queue_ids: tuple[int, ...] = ()  # per message: a duplicate reports its original queue
    detail: str = ""
    first_slot: int = 0  # the slot of the run's first message in its entry
    # per duplicate: (its index in the run, the original's commitlog position and slot)
    originals: tuple[tuple[int, int, int], ...] = ()
    runs: tuple[ApplyResult, ...] = ()
    granted: tuple[tuple[str, int], ...] = ()  # a lock entry's queues granted
    popped: tuple[tuple[int, int], ...] = ()  # a pop entry's (offset, delivery attempt) handed out
    acked: tuple[bool, ...] = ()  # a pop ack's answer per offset

    def run_results(self) -> tuple[ApplyResult, ...]:
        """One result per run: a multi-run entry's ``runs``, or this result for a send entry."""
        return self.runs or (self,)


def tag_hash(tags: str) -> int:
    """The tag code stored in consume-queue units (a server-side filter; clients re-check)."""
    return zlib.crc32(tags.encode()) if tags else 0


__all__ = ["ApplyResult", "tag_hash"]
