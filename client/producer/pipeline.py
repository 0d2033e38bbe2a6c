"""Exactly-once consume-transform-produce: a ``Pipeline`` reads a topic's queues as consumer
group ``group``, calls ``transform(message)`` for each input message, and commits each batch's
outputs together with the group's new offset on that input queue in one transaction
(``client.producer.txn_batch``): the outputs become visible and the offset moves in one log entry of
the input's broker group, or neither does.

The guarantee, within one broker group (the outputs' topics served by the input queue's broker
group, where they go): after any crash of the pipeline, a leader change or a zombie pipeline
(one that was cut off and comes back), each input message's outputs are visible exactly once and
the group resumes after the last committed input. A batch is committed on the condition that
the group's offset is still where the batch began; a pipeline that lost the race (another
instance committed that input meanwhile) sees OFFSET_CONFLICT and reads on from the new offset.
A batch left open by a crash is rolled back by the broker's check-back. The outputs of one
input keep their order; ``transform`` may be called more than once for an input (on a retry),
its outputs made visible only once, so it must not have other effects that count.

Across broker groups (an output topic the input's broker group does not serve) an output
cannot join the offset's transaction, which lives in one group's log. Such an output is sent
before the transaction commits, under a unique key derived from its input (the input's offset
message id and the output's index: ``Producer.send_keyed``), so a repeat after a crash is stored
once by the output's group: exactly once as long as the input is processed again within that
group's dedup window (10 minutes by default) and ``transform`` gives the same outputs (byte for
byte: a broker deduplicates by key and content) in the same order; past the window, at least
once. An output topic served by several groups may be stored in another group on a repeat if the
topic's queues changed in between.

Each pipeline instance processes every queue of ``topic`` it is given (all of them by default):
run one instance per set of queues; a second instance on the same queues is safe (the offset
condition fences it) but does the work twice.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence

from client import errors
from client.consumer.pull import PullConsumer
from client.producer.producer import Producer
from client.producer.transaction import TransactionProducer, TransactionState
from client.types import Message, MessageQueue, ReceivedMessage

Outputs = Sequence[Message]
Transform = Callable[[ReceivedMessage], Outputs | Awaitable[Outputs]]
BATCH_MAX = 32  # input messages per transaction, at most


class _NoChecks:
    """The pipeline's producer begins its own transactions only: no listener is asked."""

    def execute_local_transaction(self, message: Message, arg: object) -> TransactionState:
        return TransactionState.UNKNOWN

    def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        return TransactionState.UNKNOWN


class Pipeline:
    def __init__(self, namesrv: str | Sequence[str], group: str, topic: str,
                 transform: Transform, *, producer_group: str | None = None,
                 queues: Sequence[int] | None = None, batch_max: int = BATCH_MAX,
                 timeout_s: float = 10.0, suspend_ms: int = 1000) -> None:
        if not 1 <= batch_max <= 1024:
            raise ValueError(f"batch_max is 1..1024, not {batch_max}")
        self.group, self.topic, self.transform = group, topic, transform
        self.batch_max, self.suspend_ms = batch_max, suspend_ms
        self._queue_ids = None if queues is None else sorted(set(queues))
        self._pull = PullConsumer(namesrv, group, timeout_s)
        self._producer = TransactionProducer(namesrv, producer_group or f"{group}-pipeline",
                                             _NoChecks(), send_timeout_s=timeout_s)
        self._keyed = Producer(namesrv, send_timeout_s=timeout_s)  # other groups' outputs
        self.committed_inputs = 0  # input messages whose batch this instance committed
        self.conflicts = 0  # batches another instance (or an earlier one) had committed first
        self.failures = 0  # batches not committed for an error (retried)

    async def start(self) -> Pipeline:
        await self._pull.start()
        await self._producer.start()
        await self._keyed.start()
        return self

    async def close(self) -> None:
        await self._keyed.close()
        await self._producer.close()
        await self._pull.close()

    async def __aenter__(self) -> Pipeline:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _in_group(self, topic: str, group: str) -> bool:
        """Whether broker group ``group`` takes writes to ``topic`` (one no group serves yet is
        created where its first message goes: in the transaction's group)."""
        route = await self._pull._routes.route(topic)
        return any(g.group == group and g.perm & 2 for g in route.groups)

    async def queues(self) -> list[MessageQueue]:
        queues = await self._pull.fetch_queues(self.topic)
        return [q for q in queues if self._queue_ids is None or q.queue_id in self._queue_ids]

    async def run(self, stop: asyncio.Event) -> None:
        """Process every queue, each as its own loop, until ``stop`` is set."""
        async def one(mq: MessageQueue) -> None:
            while not stop.is_set():
                await self.step(mq)
        await asyncio.gather(*(one(mq) for mq in await self.queues()))

    async def lag(self) -> int:
        """Input messages not committed yet, over the queues (as the leaders have it)."""
        total = 0
        for mq in await self.queues():
            hi = (await self._pull.pull(mq, 0, 0)).max_offset
            total += hi - max(0, await self._pull.committed(mq))
        return total

    async def step(self, mq: MessageQueue) -> int:
        """One batch of ``mq``: read from the group's committed offset, transform, commit in one
        transaction; the input messages committed (0: none waiting, or not committed)."""
        try:
            expected = await self._pull.committed(mq)
            got = await self._pull.pull(mq, max(0, expected), self.batch_max, self.suspend_ms)
            if got.status == "OFFSET_OUT_OF_RANGE":  # (retention took the start of the queue)
                got = await self._pull.pull(mq, got.min_offset, self.batch_max)
            if not got.messages:
                return 0
            txn = await self._producer.begin(mq.group)
            try:
                elsewhere: list[tuple[Message, str]] = []
                for m in got.messages:
                    for k, out in enumerate(await _outputs(self.transform, m)):
                        if await self._in_group(out.topic, mq.group):
                            await txn.send(out)
                        else:  # another broker group's topic: idempotent, not transactional
                            elsewhere.append((out, f"{m.offset_msg_id}#{k}"))
                await asyncio.gather(*(self._keyed.send_keyed(out, key)
                                       for out, key in elsewhere))
                txn.commit_offset(self.group, mq, expected, got.next_offset)
                await txn.commit()
            except BaseException:
                await txn.abort()
                raise
        except errors.TransactionError as err:
            if err.status not in ("OFFSET_CONFLICT", "TXN_ALREADY_DECIDED"):
                raise
            self.conflicts += 1  # committed by another instance, or rolled back by a check
            return 0
        except errors.RetriableError:
            self.failures += 1
            await asyncio.sleep(0.1)  # a leader change under way: read the offset again then
            return 0
        except errors.SendTimeoutError:
            self.failures += 1  # committed or not: the offset read next says which
            return 0
        self.committed_inputs += len(got.messages)
        return len(got.messages)


async def _outputs(transform: Transform, m: ReceivedMessage) -> Outputs:
    got = transform(m)
    if inspect.isawaitable(got):
        got = await got
    return got


__all__ = ["Pipeline", "Transform"]
