"""The transactional workload beside a live chaos scenario (issue 18, "Chaos"), one of the
messaging features (``chaos.live.features.driver`` composes it).

Three producers of one producer group send transactional messages to a topic of 2 queues, one
at a time, about 5 a second in all, each with a plan in its body (``chaos.live.features.txn_producer``):
COMMIT, ROLLBACK, a local transaction that raises (UNKNOWN) then a check-back answering COMMIT,
UNKNOWN then ROLLBACK, UNKNOWN for a few check-backs then COMMIT. Two of them run in this
process; the third is a process of its own, killed with SIGKILL every 4-8 s (often inside a
transaction: its local transactions take 0.1-0.3 s, and it leaves its UNKNOWN ones open) and
started again under a new client id of the same group. Two push consumer groups consume the
topic and record every delivery.

After the stop: wait (bounded by ``BOUND_S``) until the leader has no open transaction, then
(bounded by ``FINISH_WAIT_S``) until each group was delivered every message the topic holds,
read the topic back from the leader and judge (``chaos.live.checkers.txn``). The brokers get a
short transaction timeout, check interval and check count (``BROKER_ARGS``). The records, the
deliveries and the read-back go to ``txn.jsonl`` in the run's directory; the producer
processes' own records to ``txn-tp<k>.jsonl`` and their log lines to ``txn-producers.log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from broker.features.txn.model import CHECK_MAX_TOPIC, TRANSACTION_ID
from broker.features.txn.service import CHECK_PERIOD_S
from chaos.live.checkers.txn import (
    COMMITTING,
    Resolution,
    TxnDelivery,
    TxnEvent,
    TxnStored,
    check_transactions,
    redeliveries,
)
from chaos.live.features.clients import SEND_ERRORS
from chaos.live.features.txn_producer import TXN_TOPIC, Recorder, load, parse, producer, send_loop
from client.consumer.push import PushConsumer
from client.producer.transaction import TransactionProducer
from client.types import ConsumeStatus, ReceivedMessage

TIMEOUT_S, INTERVAL_S, CHECK_MAX = 2.0, 1.0, 12
BROKER_ARGS = ("--transaction-timeout-s", f"{TIMEOUT_S:g}", "--transaction-check-interval-s",
               f"{INTERVAL_S:g}", "--transaction-check-max", str(CHECK_MAX))
# RocketMQ's bound, timeout + (max checks + 1) * interval, plus a period of the leader's check
# loop and some slack; from the stop (the last transaction began then). The check count is
# generous: a new leader that heard no producer's heartbeat yet (they beat every 10 s) counts
# the checks it cannot send.
BOUND_S = TIMEOUT_S + (CHECK_MAX + 1) * INTERVAL_S + CHECK_PERIOD_S + 1.75
FINISH_WAIT_S = 30.0
GROUPS = ("chaos-txn-a", "chaos-txn-b")
IN_PROCESS = ("ta", "tb")
LIFE_S = (4.0, 8.0)  # a producer process lives this long before its SIGKILL
ROOT = str(Path(__file__).resolve().parents[2])

Rows = Callable[[str, int], Awaitable[list[list[Any]]]]
Status = Callable[[], Awaitable[dict[str, Any] | None]]


class TxnFeature:
    def __init__(self, namesrv: str, work_dir: str, rng: random.Random, stop: asyncio.Event,
                 rows: Rows, leader_status: Status, queues: int) -> None:
        self.namesrv, self.work_dir, self.rng, self.stop = namesrv, work_dir, rng, stop
        self.rows, self.leader_status, self.queues = rows, leader_status, queues
        self.rec = Recorder()
        self.deliveries: list[TxnDelivery] = []
        self._producers: list[TransactionProducer] = []
        self._consumers: list[PushConsumer] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self.records: list[str] = []  # the producer processes' record files
        self.kills = 0
        self.result: dict[str, Any] = {}
        self.problems: list[str] = []

    async def start(self) -> None:
        for group in GROUPS:
            c = PushConsumer(self.namesrv, group, self._listener(group), client_id=f"{group}-0",
                             heartbeat_s=1.0, rebalance_s=2.0, commit_s=1.0, suspend_ms=500,
                             start_from="first")
            c.subscribe(TXN_TOPIC)
            await c.start()
            self._consumers.append(c)
        for name in IN_PROCESS:
            p = producer(self.namesrv, name, self.rec, random.Random(self.rng.random()))
            self._producers.append(await p.start())
        self._tasks = [asyncio.create_task(send_loop(p, name, self.rec, self.stop))
                       for p, name in zip(self._producers, IN_PROCESS)]
        self._tasks.append(asyncio.create_task(self._churn()))

    def _listener(self, group: str) -> Callable[[list[ReceivedMessage]], ConsumeStatus]:
        def consume(batch: list[ReceivedMessage]) -> ConsumeStatus:
            for m in batch:
                try:
                    send_id = parse(m.body)[0]
                except ValueError:
                    send_id = f"?{m.msg_id}"
                self.deliveries.append(TxnDelivery(group, send_id,
                                                   f"{m.queue.queue_id}@{m.queue_offset}",
                                                   time.monotonic()))
            return ConsumeStatus.SUCCESS
        return consume

    # -- the producer process, killed and started again ------------------------------------------

    async def _churn(self) -> None:
        k = 0
        while not self.stop.is_set():
            k += 1
            name = f"tp{k}"
            path = os.path.join(self.work_dir, f"txn-{name}.jsonl")
            self.records.append(path)
            self._proc = await asyncio.to_thread(self._spawn, name, path)
            with contextlib.suppress(asyncio.TimeoutError):  # its life: the kill's schedule
                await asyncio.wait_for(self.stop.wait(), self.rng.uniform(*LIFE_S))
            await self._kill()

    def _spawn(self, name: str, path: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])}
        with open(os.path.join(self.work_dir, "txn-producers.log"), "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "chaos.live.features.txn_producer", self.namesrv, path, name,
                 str(self.rng.randrange(1 << 30))], stdout=log, stderr=log, env=env,
                stdin=subprocess.DEVNULL)

    async def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)  # mid-transaction, most likely: no END, no leave
            self.kills += 1
        await asyncio.to_thread(proc.wait, 10)

    # -- the end -----------------------------------------------------------------------------------

    async def finish(self) -> None:
        """After ``stop``: wait for the transactions to resolve and be consumed, close the
        clients, read back, judge (``problems``; ``result`` the counts)."""
        crashed = [r for r in await asyncio.gather(*self._tasks, return_exceptions=True)
                   if isinstance(r, BaseException)]
        self._tasks = []
        start = time.monotonic()
        resolved_in = await self._resolved(start)
        stored = await self._consumed(start)
        open_left = await self._open()
        check_max = await self._count_check_max()
        await self.close()
        events = self.events()
        self.problems = [f"harness: a transactional client failed: {err!r}" for err in crashed]
        if stored is None:
            self.problems.append("harness: the transactional topic could not be read back")
        self.problems += check_transactions(events, self.deliveries, stored or [], GROUPS,
                                            Resolution(open_left, resolved_in, BOUND_S))
        self.result = self._summary(events, stored or [], open_left, resolved_in, check_max)
        self._write(events, stored or [])

    def events(self) -> list[TxnEvent]:
        return [*self.rec.events, *(e for path in self.records for e in load(path))]

    async def _open(self) -> int:
        st = await self.leader_status()
        return -1 if st is None else int(st["transactions"]["open"])

    async def _resolved(self, start: float) -> float | None:
        """Seconds until the leader had no open transaction; None if ``BOUND_S`` ran out."""
        while time.monotonic() - start < BOUND_S + 1.0:
            if await self._open() == 0:
                return round(time.monotonic() - start, 1)
            await asyncio.sleep(0.5)  # polling interval of a bounded wait
        return None

    async def _consumed(self, start: float) -> list[TxnStored] | None:
        """The topic read back once each group was delivered all it holds (or the wait ran
        out: the last read); None if it could never be read."""
        stored: list[TxnStored] | None = None
        while True:
            with contextlib.suppress(*SEND_ERRORS):
                stored = await self._stored()
            if stored is not None and all(
                    {s.copy for s in stored} <= {d.copy for d in self.deliveries if d.group == g}
                    for g in GROUPS):
                return stored
            if time.monotonic() - start > FINISH_WAIT_S:
                return stored
            await asyncio.sleep(1.0)  # polling interval of a bounded wait

    async def _stored(self) -> list[TxnStored]:
        out = []
        for q in range(self.queues):
            for offset, raw, _tags, _keys, key, props, *_ in await self.rows(TXN_TOPIC, q):
                try:
                    send_id = parse(raw)[0]
                except ValueError:
                    send_id = f"?{key}"
                out.append(TxnStored(send_id, f"{q}@{offset}",
                                     str(dict(map(tuple, props)).get(TRANSACTION_ID, ""))))
        return out

    async def _count_check_max(self) -> int:
        """Transactions rolled back after the last check (only this workload's transactions run
        on the cluster); -1: not read."""
        try:
            return len(await self.rows(CHECK_MAX_TOPIC, 0))
        except SEND_ERRORS:
            return -1

    def _summary(self, events: list[TxnEvent], stored: list[TxnStored], open_left: int,
                 resolved_in: float | None, check_max: int) -> dict[str, Any]:
        plan = {e.send_id: e.plan for e in events if e.kind == "invoke"}
        sender = {e.send_id: e.producer for e in events if e.kind == "invoke"}
        halves = {e.send_id for e in events if e.kind == "half"}
        ended = {e.send_id for e in events if e.kind in ("sent", "fail")}
        checked = {e.send_id: e.producer for e in events if e.kind == "decide" and e.by == "check"}
        halved_t = {e.send_id: e.t for e in events if e.kind == "half"}
        decided_t: dict[str, float] = {}
        for e in events:
            if e.kind == "decide" and e.by == "check" and e.send_id in halved_t:
                decided_t[e.send_id] = min(e.t, decided_t.get(e.send_id, e.t))
        slowest = max((t - halved_t[i] for i, t in decided_t.items()), default=None)
        # producer processes killed inside a send (a send begun, not returned)
        mid = len({sender[i] for i in set(plan) - ended if sender[i].startswith("tp")})
        return {
            "sent": len(plan), "halves": len(halves),
            "committed": len({s.send_id for s in stored}),
            "rolled_back": sum(1 for i in halves if plan.get(i) not in COMMITTING),
            "resolved_by_check": len(checked),
            "resolved_for_another": sum(1 for i, p in checked.items() if p != sender.get(i)),
            "producer_kills": self.kills, "killed_mid_send": mid,
            "deliveries": len(self.deliveries), "redeliveries": redeliveries(self.deliveries),
            "open_left": open_left, "resolved_in_s": resolved_in, "bound_s": BOUND_S,
            "check_max_rollbacks": check_max, "violations": len(self.problems),
            # the longest a check-back took to decide a transaction, from its half (faults in)
            "slowest_check_s": None if slowest is None else round(slowest, 1),
        }

    def _write(self, events: list[TxnEvent], stored: list[TxnStored]) -> None:
        with open(os.path.join(self.work_dir, "txn.jsonl"), "w", encoding="utf-8") as f:
            f.write(json.dumps({"result": self.result}) + "\n")
            for kind, items in (("event", events), ("delivery", self.deliveries),
                                ("stored", stored)):
                for item in items:
                    f.write(json.dumps({"f": kind, **asdict(item)}) + "\n")

    async def close(self) -> None:
        """Stop whatever still runs (also after a harness error)."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._kill()
        consumers, self._consumers = self._consumers, []
        producers, self._producers = self._producers, []
        await asyncio.gather(*(c.close() for c in consumers), return_exceptions=True)
        await asyncio.gather(*(p.close() for p in producers), return_exceptions=True)


__all__ = ["BOUND_S", "BROKER_ARGS", "GROUPS", "TXN_TOPIC", "TxnFeature"]
