"""The transactional producers of the live chaos run (``chaos.live.features.txn``): what they send,
how their listener answers, and what they record for ``chaos.live.checkers.txn``.

Message *i* of a producer carries its plan (``txn_checker.PLANS[i % 5]``) and, for
``unknown-commit``, the time its local transaction commits, in its body
(``<send id>|<plan>|<due ms>``): the body is the "local database", so that any producer of the
group, a restarted one too, answers a check-back for it the same way. The listener takes
``EXECUTE_S`` of work before it answers (a local transaction takes time: a producer killed then
leaves its half message open), records each COMMIT or ROLLBACK it decides before it answers, and
raises for ``raise-commit``.

Run as a process (``python -m chaos.live.features.txn_producer NAMESRV RECORD NAME SEED``) it sends until
it is killed (the feature kills it with SIGKILL every few seconds), writing each record as one
flushed JSON line to RECORD, so that what it did survives the kill; it exits by itself if its
parent is gone or after ``LIFETIME_MAX_S``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import threading
import time
from dataclasses import asdict
from typing import IO, Any

from chaos.live.checkers.txn import PLANS, TxnEvent
from chaos.live.features.clients import SEND_ERRORS
from client.producer.transaction import TransactionProducer, TransactionState
from client.types import Message, ReceivedMessage

TXN_TOPIC = "chaos-txn"
PRODUCER_GROUP = "chaos-txn-producers"
SEND_PAUSE_S = 0.5  # between one producer's sends: about 5 transactions a second for three
EXECUTE_S = (0.1, 0.3)  # a local transaction's work
UNKNOWN_FOR_S = 4.5  # unknown-commit: checked back (UNKNOWN) this long before it commits
SEND_WAIT_S = 10.0  # one whole transactional send, at most
LIFETIME_MAX_S = 300.0  # a producer process left behind ends by itself


class LocalTransactionError(RuntimeError):
    """The ``raise-commit`` plan's local transaction: it fails (the producer counts UNKNOWN)."""


class Recorder:
    """Records go to a list (``events``) and, for a producer process, a file a line at a time,
    flushed (listeners run on worker threads: one lock)."""

    def __init__(self, out: IO[str] | None = None) -> None:
        self.events: list[TxnEvent] = []
        self._out = out
        self._lock = threading.Lock()

    def add(self, kind: str, send_id: str, **fields: str) -> None:
        e = TxnEvent(kind, send_id, time.monotonic(), **fields)
        with self._lock:
            self.events.append(e)
            if self._out is not None:
                self._out.write(json.dumps(asdict(e)) + "\n")
                self._out.flush()


def load(path: str) -> list[TxnEvent]:
    """A producer process's records (a line torn by its kill is skipped)."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    out.append(TxnEvent(**json.loads(line)))
                except (ValueError, TypeError):
                    continue
    except FileNotFoundError:
        return []
    return out


def body(send_id: str, plan: str, due_ms: int) -> bytes:
    return f"{send_id}|{plan}|{due_ms}".encode()


def parse(raw: bytes) -> tuple[str, str, int]:
    """(send id, plan, due ms) of a body; ValueError if it is no such body."""
    send_id, plan, due = raw.decode().split("|")
    return send_id, plan, int(due)


def check_answer(plan: str, due_ms: int, now_ms: int) -> TransactionState:
    """What the local database says when a check-back asks about a send of ``plan``."""
    if plan in ("rollback", "unknown-rollback"):
        return TransactionState.ROLLBACK
    if plan == "unknown-commit" and now_ms < due_ms:
        return TransactionState.UNKNOWN
    return TransactionState.COMMIT


class PlanListener:
    def __init__(self, producer: str, rec: Recorder, rng: random.Random) -> None:
        self.producer, self.rec, self.rng = producer, rec, rng
        self._work = [rng.uniform(*EXECUTE_S) for _ in range(64)]
        self._turn = 0

    def _decided(self, send_id: str, state: TransactionState, by: str) -> TransactionState:
        if state in (TransactionState.COMMIT, TransactionState.ROLLBACK):
            self.rec.add("decide", send_id, state=state.value, by=by, producer=self.producer)
        return state

    def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
        send_id, plan, _ = parse(message.body)
        self._turn += 1
        time.sleep(self._work[self._turn % len(self._work)])  # the local transaction's work
        if plan == "raise-commit":
            raise LocalTransactionError(send_id)
        state = {"commit": TransactionState.COMMIT, "rollback": TransactionState.ROLLBACK
                 }.get(plan, TransactionState.UNKNOWN)
        return self._decided(send_id, state, "execute")

    def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        try:
            send_id, plan, due_ms = parse(message.body)
        except ValueError:
            return TransactionState.UNKNOWN  # not this workload's
        return self._decided(send_id, check_answer(plan, due_ms, int(time.time() * 1000)),
                             "check")


def producer(namesrv: str, name: str, rec: Recorder, rng: random.Random) -> TransactionProducer:
    return TransactionProducer(namesrv, PRODUCER_GROUP, PlanListener(name, rec, rng),
                               send_timeout_s=3.0, execute_timeout_s=2.0, check_timeout_s=2.0,
                               client_id=name)


async def send_loop(prod: TransactionProducer, name: str, rec: Recorder, stop: asyncio.Event,
                    deadline: float = float("inf")) -> None:
    """Send transactions, one at a time, until ``stop`` (or ``deadline``, monotonic)."""
    i = 0
    while not stop.is_set() and time.monotonic() < deadline:
        plan = PLANS[i % len(PLANS)]
        send_id = f"{name}-{i}"
        i += 1
        due_ms = int(time.time() * 1000 + UNKNOWN_FOR_S * 1000) if plan == "unknown-commit" else 0
        rec.add("invoke", send_id, plan=plan, producer=name)
        try:
            r = await asyncio.wait_for(prod.send(Message(TXN_TOPIC, body(send_id, plan, due_ms))),
                                       SEND_WAIT_S)
        except SEND_ERRORS as err:
            rec.add("fail", send_id, state=type(err).__name__)
        else:
            rec.add("half", send_id, txn_id=r.transaction_id)
            if r.state in (TransactionState.COMMIT, TransactionState.ROLLBACK) \
                    and not r.end_error:
                rec.add("end", send_id, state=r.state.value)
            rec.add("sent", send_id, state=r.state.value)
        try:
            await asyncio.wait_for(stop.wait(), SEND_PAUSE_S)
        except TimeoutError:
            pass


async def _main(namesrv: str, path: str, name: str, seed: int) -> None:
    parent = os.getppid()
    stop = asyncio.Event()

    async def orphaned() -> None:
        while os.getppid() == parent:
            await asyncio.sleep(1.0)  # polling interval: the parent is watched, not awaited
        stop.set()

    with open(path, "a", encoding="utf-8") as out:
        rec = Recorder(out)
        watch = asyncio.create_task(orphaned())
        async with producer(namesrv, name, rec, random.Random(seed)) as prod:
            await send_loop(prod, name, rec, stop, time.monotonic() + LIFETIME_MAX_S)
        watch.cancel()


def main(argv: list[str]) -> None:
    namesrv, path, name, seed = argv
    asyncio.run(_main(namesrv, path, name, int(seed)))


if __name__ == "__main__":
    main(sys.argv[1:])


__all__ = [
    "PRODUCER_GROUP",
    "TXN_TOPIC",
    "Recorder",
    "body",
    "check_answer",
    "load",
    "parse",
    "producer",
    "send_loop",
]
