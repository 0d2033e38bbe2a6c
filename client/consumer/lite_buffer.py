"""The lite pull consumer's memory of its queues, as a plain object (no I/O, no asyncio, no
clock): per assigned queue, the messages pulled but not yet polled (at most ``buffer_max``), the
next offset to pull, and what was last committed; ``take`` hands out messages round-robin over
the queues, and ``committable`` is a queue's progress as far as poll returned it, never further.

Offsets: a queue's buffer holds messages below its ``next_pull``; what the pulls skipped (other
tags) lies between them and counts as consumed. So the committable offset is the first buffered
message's offset, or ``next_pull`` when the buffer is empty. ``reset`` (a seek) empties the
buffer and bumps the queue's epoch: a pull begun before it cannot land (``put`` refuses)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from client.types import MessageQueue, ReceivedMessage


@dataclass
class _Queue:
    next_pull: int = -1  # -1 until the start offset is known
    epoch: int = 0
    committed: int = -1  # what this member last committed (-1: nothing yet)
    messages: deque[ReceivedMessage] = field(default_factory=deque)


class QueueBuffers:
    def __init__(self, buffer_max: int) -> None:
        assert buffer_max >= 1
        self.buffer_max = buffer_max
        self._queues: dict[MessageQueue, _Queue] = {}
        self._cursor = 0  # where the next take starts, in the sorted queues

    def __contains__(self, mq: object) -> bool:
        return mq in self._queues

    def queues(self) -> list[MessageQueue]:
        return sorted(self._queues)

    def add(self, mq: MessageQueue) -> None:
        """A queue assigned to this member; its start offset comes with ``start``."""
        self._queues.setdefault(mq, _Queue())

    def remove(self, mq: MessageQueue) -> int:
        """Forget a queue (its buffer is dropped); returns its committable offset (-1: none)."""
        offset = self.committable(mq)
        del self._queues[mq]
        return offset

    def start(self, mq: MessageQueue, offset: int) -> None:
        """The queue's start offset, unless a seek set one meanwhile."""
        q = self._queues.get(mq)
        if q is not None and q.next_pull < 0:
            q.next_pull = offset

    def position(self, mq: MessageQueue) -> tuple[int, int]:
        """(the next offset to pull, the epoch to give back to ``put``)."""
        q = self._queues[mq]
        return q.next_pull, q.epoch

    def room(self, mq: MessageQueue) -> int:
        """How many more messages the queue's buffer takes (0: its puller waits)."""
        q = self._queues.get(mq)
        return 0 if q is None else max(0, self.buffer_max - len(q.messages))

    def put(self, mq: MessageQueue, epoch: int, messages: Iterable[ReceivedMessage],
            next_offset: int) -> bool:
        """A pull's answer: its messages buffered, ``next_pull`` moved to ``next_offset``. False
        (nothing changes) if the queue was given away or reset since that pull began."""
        q = self._queues.get(mq)
        if q is None or q.epoch != epoch:
            return False
        q.messages.extend(messages)
        q.next_pull = next_offset
        return True

    def reset(self, mq: MessageQueue, offset: int) -> None:
        """Seek: the buffered messages are dropped and pulls go on from ``offset``."""
        q = self._queues[mq]
        q.messages.clear()
        q.next_pull = offset
        q.epoch += 1

    def buffered(self, mq: MessageQueue | None = None) -> int:
        """Messages waiting for a poll, in one queue or in all."""
        if mq is not None:
            return len(self._queues[mq].messages) if mq in self._queues else 0
        return sum(len(q.messages) for q in self._queues.values())

    def take(self, n: int) -> list[ReceivedMessage]:
        """Up to ``n`` buffered messages, round-robin: each take starts at the queue after the
        one the last take ended on, and drains a queue before going on to the next."""
        order = self.queues()
        out: list[ReceivedMessage] = []
        for step in range(len(order)):
            k = (self._cursor + step) % len(order)
            messages = self._queues[order[k]].messages
            while messages and len(out) < n:
                out.append(messages.popleft())
            if len(out) >= n:
                self._cursor = (k + 1) % len(order)
                break
        else:
            self._cursor = (self._cursor + 1) % max(1, len(order))
        return out

    def committable(self, mq: MessageQueue) -> int:
        """The next offset to consume as far as poll returned: -1 before the start is known."""
        q = self._queues.get(mq)
        if q is None:
            return -1
        return q.messages[0].queue_offset if q.messages else q.next_pull

    def due(self) -> dict[MessageQueue, int]:
        """Each queue's committable offset where it moved since its last commit."""
        return {mq: c for mq in self._queues
                if (c := self.committable(mq)) >= 0 and c != self._queues[mq].committed}

    def committed(self, mq: MessageQueue, offset: int) -> None:
        """``offset`` was committed for ``mq`` (by this member)."""
        if mq in self._queues:
            self._queues[mq].committed = offset
