"""A transaction of many messages and consumer offsets in one broker group (Kafka's transactions,
which RocketMQ lacks), begun by ``TransactionProducer.begin(broker_group)``.

``send`` buffers messages (each to a queue of its topic in that broker group); ``commit_offset``
adds a consumer group's offset to set with them, conditional on its current value (``expected``,
-1 for none: the fence against a zombie or a second consumer of the same input); ``commit``
stores the buffered messages as half messages (one TXN_HALF request per queue) and ends the
transaction with one END_TRANSACTION: the broker applies every message copy and every offset in
one log entry, or, if an offset moved, none (``TransactionError``, status OFFSET_CONFLICT). A
commit whose answer is lost is repeated within the producer's deadline; the broker answers a
repeat as the first. ``abort`` rolls back. A transaction left open (its producer crashed) is
rolled back by the broker's check-back, which the producer that began it, or any later one of
its producer group, answers ROLLBACK.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Protocol

from client import errors
from client.cluster.routes import GroupRoute, Routes
from client.producer.producer import _check_size, _encode
from client.types import Message, MessageQueue, SendResult
from protocol import broker_kinds as bp

MESSAGES_MAX = 1024  # in one transaction (the broker's limit of half messages)


class TransactionOwner(Protocol):
    """What a transaction uses of the producer that began it (``client.producer.transaction``)."""

    group: str
    send_timeout_s: float
    _routes: Routes
    _turn: itertools.count[int]

    async def call(self, g: GroupRoute, timeout_s: float, kind: int, *args: Any) -> Any:
        """A request to ``g``'s leader, within the deadline."""

    def _forget(self, txn_id: str) -> None:
        """The transaction ended: its check-backs are no longer this producer's to answer."""


class Transaction:
    def __init__(self, producer: TransactionOwner, group: GroupRoute, txn_id: str) -> None:
        self.producer = producer
        self.group = group
        self.transaction_id = txn_id
        self._runs: dict[tuple[str, int], list[list[Any]]] = {}
        self._offsets: dict[tuple[str, str, int], tuple[int, int]] = {}
        self._count = 0
        self._halves_sent = False
        self.done = False

    async def send(self, message: Message, queue_id: int | None = None) -> MessageQueue:
        """Buffer ``message`` for a queue of its topic in this transaction's broker group (round
        robin over its writable queues there, across the producer's transactions, unless
        ``queue_id`` names one); the queue."""
        self._check_open()
        _check_size(message)
        if message.delayed:
            raise errors.BadTransactionError("a transactional message cannot be delayed")
        if self._count >= MESSAGES_MAX:
            raise errors.BadTransactionError(f"a transaction holds at most {MESSAGES_MAX} "
                                             f"messages")
        route = await self.producer._routes.route(message.topic)
        here = [g for g in route.groups if g.group == self.group.group and g.perm & 2]
        if not here:
            raise errors.TopicNotFoundError(f"broker group {self.group.group} takes no writes to "
                                            f"{message.topic!r}: a transaction lives in one group")
        queues = here[0].write_queues
        qid = next(self.producer._turn) % queues if queue_id is None else queue_id
        if not 0 <= qid < queues:
            raise ValueError(f"queue {qid} of {message.topic} (it has {queues} in "
                             f"{self.group.group})")
        self._runs.setdefault((message.topic, qid), []).extend(_encode([message]))
        self._count += 1
        return MessageQueue(message.topic, self.group.group, qid)

    def commit_offset(self, consumer_group: str, mq: MessageQueue, expected: int,
                      offset: int) -> None:
        """Set ``consumer_group``'s offset on ``mq`` (a queue of this broker group) to
        ``offset`` with the commit, if it is still ``expected`` then (-1: never committed)."""
        self._check_open()
        if mq.group != self.group.group:
            raise ValueError(f"{mq} is not in broker group {self.group.group}: a transaction "
                             f"lives in one group")
        if expected < -1 or offset < 0:
            raise ValueError(f"offsets are >= 0 (expected may be -1), not {expected}, {offset}")
        self._offsets[(consumer_group, mq.topic, mq.queue_id)] = (expected, offset)

    async def commit(self) -> list[SendResult]:
        """Make every buffered message visible and every offset set, at once; where each
        message is, in the order sent per queue."""
        self._check_open()
        if not self._runs and not self._offsets:
            raise ValueError("an empty transaction: nothing to commit")
        p = self.producer
        try:
            await self._send_halves()
            offsets = [[g, t, q, e, o] for (g, t, q), (e, o) in self._offsets.items()]
            _decision, copies = await p.call(self.group, p.send_timeout_s, bp.END_TRANSACTION,
                                            p.group, self.transaction_id, "COMMIT", False,
                                            offsets)
        finally:
            self._close()
        return [SendResult("SEND_OK", "", offset_id, MessageQueue(topic, self.group.group, qid),
                           offset) for topic, qid, offset, offset_id in copies]

    async def abort(self) -> None:
        """Roll back (nothing of it is ever visible). Best effort: a transaction whose rollback
        is not acknowledged is rolled back by the broker's check-back."""
        if self.done:
            return
        p = self.producer
        try:
            if self._halves_sent:
                await p.call(self.group, p.send_timeout_s, bp.END_TRANSACTION, p.group,
                             self.transaction_id, "ROLLBACK", False, [])
        except errors.ClientError:
            pass  # the check-back rolls it back: this producer answers ROLLBACK from now on
        finally:
            self._close()

    async def _send_halves(self) -> None:
        p = self.producer
        self._halves_sent = bool(self._runs)
        await asyncio.gather(*(
            p.call(self.group, p.send_timeout_s, bp.TXN_HALF, p.group, self.transaction_id,
                   topic, qid, msgs) for (topic, qid), msgs in self._runs.items()))

    def _check_open(self) -> None:
        if self.done:
            raise errors.TransactionError(f"transaction {self.transaction_id} has ended",
                                          "ENDED")

    def _close(self) -> None:
        self.done = True
        self.producer._forget(self.transaction_id)


__all__ = ["Transaction"]
