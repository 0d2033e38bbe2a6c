"""The transactional producer (RocketMQ's ``TransactionMQProducer``): a half message, the user's
local transaction, then COMMIT or ROLLBACK; check-backs from the brokers answered by the user's
``check_local_transaction``.

``send(message, arg)`` stores the message as a half message (invisible to every consumer) in a
queue of its topic, runs ``listener.execute_local_transaction(message, arg)`` (sync callbacks
run on a worker thread; either kind is given ``execute_timeout_s``: one that raises or hangs
counts as UNKNOWN), and ends the transaction as it answered. UNKNOWN leaves the decision to the
broker's check-back: after its transaction timeout (6 s by default) and then every check
interval, the leader asks a live producer of the same group, which runs
``listener.check_local_transaction(message)`` and ends the transaction if it answers COMMIT or
ROLLBACK. So a producer that restarted (same group) resolves what its predecessor began. After
the broker's last check (15 by default) the transaction rolls back.

An END whose answer is lost is retried within ``send_timeout_s`` (the broker answers a repeated
END as the first one); if it still has no answer, the result says so (``end_error``) and the
check-back settles it. A COMMIT and a ROLLBACK of one transaction never both take effect.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import itertools
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from client import errors
from client.cluster.routes import GroupRoute, Routes, client_error
from client.lifecycle import Lifecycle
from client.producer.group import CheckRequest, ProducerRegistration, new_client_id
from client.producer.producer import _check_size, _encode, trace_producer
from client.producer.txn_batch import Transaction
from client.trace.tracer import Tracer
from client.types import Message, MessageQueue, ReceivedMessage, SendResult
from protocol import broker_kinds as bp
from protocol.auth import Credentials
from protocol.errors import DLedgerError, OutcomeUnknownError

ATTEMPT_S_MAX = 3.0  # one attempt of a transaction's request, within its deadline
CHECKS_IN_FLIGHT_MAX = 64  # check-backs answered at once; more are dropped (asked again later)
OWN_PREFIX = "P:"  # the ids of begin()'s transactions (a unique key, the others' id, is hex)


class TransactionState(enum.Enum):
    COMMIT = "COMMIT"  # RocketMQ's COMMIT_MESSAGE
    ROLLBACK = "ROLLBACK"  # ROLLBACK_MESSAGE
    UNKNOWN = "UNKNOWN"  # UNKNOW: the broker will check back


StateOrAwaitable = TransactionState | Awaitable[TransactionState]


class TransactionListener(Protocol):
    def execute_local_transaction(self, message: Message, arg: Any) -> StateOrAwaitable: ...

    def check_local_transaction(self, message: ReceivedMessage) -> StateOrAwaitable: ...


@dataclass(frozen=True, slots=True)
class TransactionSendResult:
    """``state``: what the local transaction answered. ``half``: the half message (its queue the
    real one, its queue offset the half queue's). ``committed``: where the message is visible,
    once a COMMIT was acknowledged (None otherwise). ``end_error``: why the END was not
    acknowledged (empty if it was, or if none was sent for UNKNOWN)."""

    state: TransactionState
    transaction_id: str
    half: SendResult
    committed: SendResult | None = None
    end_error: str = ""


class TransactionProducer:
    def __init__(self, namesrv: str | Sequence[str], group: str, listener: TransactionListener,
                 *, send_timeout_s: float = 3.0, execute_timeout_s: float = 10.0,
                 check_timeout_s: float = 10.0, client_id: str | None = None,
                 trace: bool = False, credentials: Credentials | None = None) -> None:
        self._namesrv = [namesrv] if isinstance(namesrv, str) else list(namesrv)
        self.group = group
        self.listener = listener
        self.send_timeout_s = send_timeout_s
        self.execute_timeout_s = execute_timeout_s
        self.check_timeout_s = check_timeout_s
        self.client_id = client_id or new_client_id()
        self._life = Lifecycle("TransactionProducer")
        self._routes = Routes(self._namesrv, credentials=credentials)
        self.tracer = Tracer(self._namesrv, self.client_id, trace_producer(self._namesrv)) \
            if trace else None  # client.trace.tracer
        self._registration = ProducerRegistration(self._routes, group, self.client_id,
                                                  self._on_check)
        self._turn = itertools.count()
        self._checks: set[asyncio.Task[None]] = set()
        self._own_ids = itertools.count()
        self._own: set[str] = set()  # begin()'s transactions open in this producer
        self.checks_answered = 0  # check-backs this producer ended (COMMIT or ROLLBACK)
        self.checks_dropped = 0  # check-backs not answered: too many at once

    async def start(self) -> TransactionProducer:
        async def work() -> None:
            await self._routes.start()
            await self._registration.start()
        await self._life.start(work)
        return self

    async def close(self) -> None:
        if not self._life.close():
            return
        await self._registration.stop()
        if self.tracer is not None:
            await self.tracer.close()
        for task in list(self._checks):
            task.cancel()
        await asyncio.gather(*self._checks, return_exceptions=True)
        await self._routes.close()

    async def __aenter__(self) -> TransactionProducer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def producers(self) -> set[str]:
        """The client ids of this producer group's live members, as the brokers know them."""
        self._life.check()
        return await self._registration.beat()

    # -- send ----------------------------------------------------------------------------------

    async def send(self, message: Message, arg: Any = None) -> TransactionSendResult:
        """A transactional send (RocketMQ's ``sendMessageInTransaction``); see the module.
        With ``trace``, its record (status ``TXN_COMMIT``, ``TXN_ROLLBACK`` or ``TXN_UNKNOWN``)
        names the committed message, or the half message if none was committed."""
        began, t0 = time.time(), time.perf_counter()
        result = await self._send(message, arg)
        if self.tracer is not None:
            self.tracer.sent_in_transaction(message, result.committed or result.half, began, t0,
                                            result.state.value, self.group)
        return result

    async def _send(self, message: Message, arg: Any) -> TransactionSendResult:
        self._life.check()
        _check_size(message)
        if message.delayed:
            raise errors.BadTransactionError("a transactional message cannot be delayed")
        mq, g = await self._choose(message.topic)
        (encoded,) = _encode([message])
        txn_id = encoded[3]  # the unique key names the transaction (RocketMQ's transactionId)
        got = await self.call(g, self.send_timeout_s, bp.TXN_HALF, self.group, txn_id,
                               mq.topic, mq.queue_id, [encoded])
        half = SendResult("SEND_OK", txn_id, got[3][0], MessageQueue(mq.topic, g.group, got[1]),
                          got[2][0], bool(got[4][0]))
        state = await _run(self.listener.execute_local_transaction, self.execute_timeout_s,
                           message, arg)
        if state is TransactionState.UNKNOWN:
            return TransactionSendResult(state, txn_id, half)
        try:
            ended = await self.call(g, self.send_timeout_s, bp.END_TRANSACTION, self.group,
                                     txn_id, state.value, False, [])
        except errors.ClientError as err:
            return TransactionSendResult(state, txn_id, half, end_error=str(err))
        return TransactionSendResult(state, txn_id, half, _committed(txn_id, g.group, ended))

    async def _choose(self, topic: str) -> tuple[MessageQueue, GroupRoute]:
        route = await self._routes.route(topic)
        queues = sorted((MessageQueue(topic, g.group, q), g) for g in route.groups
                        if g.perm & 2 for q in range(g.write_queues))
        if not queues:
            raise errors.TopicNotFoundError(f"no group takes writes to {topic!r}")
        return queues[next(self._turn) % len(queues)]

    async def call(self, g: GroupRoute, timeout_s: float, kind: int, *args: Any) -> Any:
        """A request to ``g``'s leader, retried there while the deadline lasts when its outcome
        is unknown (both TXN_HALF, by its unique key, and END are safe to repeat). One attempt
        waits at most ``ATTEMPT_S_MAX``: a node that stops answering (the killed leader's
        connection not yet seen closed) is suspected and the next attempt asks another."""
        deadline = time.monotonic() + timeout_s
        client = self._routes.group_client(g)
        while True:
            left = min(deadline - time.monotonic(), ATTEMPT_S_MAX)
            try:
                _, got = await client.call_leader(kind, *args, timeout_s=max(0.05, left))
                return got
            except OutcomeUnknownError as err:
                if time.monotonic() >= deadline:
                    raise client_error(err) from err
            except DLedgerError as err:
                mapped = client_error(err)
                if not isinstance(mapped, errors.RetriableError) or time.monotonic() >= deadline:
                    raise mapped from err
                await asyncio.sleep(0.05)  # no leader yet: an election is under way

    # -- transactions of many messages ---------------------------------------------------------

    async def begin(self, broker_group: str) -> Transaction:
        """A transaction of many messages and consumer offsets in one broker group (Kafka's
        ``begin_transaction``; ``client.producer.txn_batch``). The producer answers check-backs of its
        own transactions itself: UNKNOWN while one is open here, ROLLBACK for any other (a
        predecessor's, which will never commit), so its listener never sees them."""
        self._life.check()
        g = next((g for g in await self._routes.cluster_groups() if g.group == broker_group),
                 None)
        if g is None:
            raise errors.UnavailableError(f"no broker group {broker_group!r} is registered")
        txn_id = f"{OWN_PREFIX}{self.client_id}:{next(self._own_ids)}"
        self._own.add(txn_id)
        return Transaction(self, g, txn_id)

    def _forget(self, txn_id: str) -> None:
        self._own.discard(txn_id)

    # -- check-back --------------------------------------------------------------------------------

    def _on_check(self, check: CheckRequest) -> None:
        if len(self._checks) >= CHECKS_IN_FLIGHT_MAX:
            self.checks_dropped += 1
            return
        task = asyncio.get_running_loop().create_task(self._answer(check))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _answer(self, check: CheckRequest) -> None:
        if check.transaction_id.startswith(OWN_PREFIX):  # one of begin()'s: not the listener's
            state = TransactionState.UNKNOWN if check.transaction_id in self._own \
                else TransactionState.ROLLBACK
        else:
            state = await _run(self.listener.check_local_transaction, self.check_timeout_s,
                               check.message)
        g = self._registration.groups.get(check.broker_group)
        if state is TransactionState.UNKNOWN or g is None:
            return
        try:
            await self.call(g, self.send_timeout_s, bp.END_TRANSACTION, self.group,
                             check.transaction_id, state.value, True, [])
            self.checks_answered += 1
        except errors.ClientError:
            return  # the broker asks again at its next check


async def _run(fn: Any, timeout_s: float, *args: Any) -> TransactionState:
    """A listener callback's answer; UNKNOWN if it raises, hangs past ``timeout_s`` or answers
    anything but a TransactionState. A plain function runs on a worker thread."""
    try:
        async with asyncio.timeout(timeout_s):
            if inspect.iscoroutinefunction(fn):
                got = await fn(*args)
            else:
                got = await asyncio.to_thread(fn, *args)
                if inspect.isawaitable(got):
                    got = await got
    except Exception:  # the user's callback: any failure is UNKNOWN
        return TransactionState.UNKNOWN
    return got if isinstance(got, TransactionState) else TransactionState.UNKNOWN


def _committed(txn_id: str, group: str, ended: list[Any]) -> SendResult | None:
    _, copies = ended
    if not copies:
        return None  # a repeated END: it was committed before (where is not in the answer)
    topic, qid, offset, offset_id = copies[0]
    return SendResult("SEND_OK", txn_id, offset_id, MessageQueue(topic, group, qid), offset)


__all__ = ["TransactionListener", "TransactionProducer", "TransactionSendResult",
           "TransactionState"]
