"""The messaging features beside a live chaos scenario: delayed messages, ordered consumption,
retry and dead letters, each driven through the real client library while the scenario's faults
run (``chaos.live.features.clients``), then waited for, read back and judged by its checker
(``chaos.live.checkers.delay``, ``orderly_checker``, ``retry_checker``); and transactional
messages, a feature of its own composed here (``chaos.live.features.txn``).

The runner calls ``start`` once the first leader is there, sets the producers' stop event after
the final heal, then calls ``finish``: it waits (bounded by ``FINISH_WAIT_S``) until every
acknowledged ordered message was processed, every retried message was consumed or
dead-lettered and no timer is pending, closes the consumers, reads the delayed topic and the
dead-letter queue from the leader, and keeps the verdicts (``result``, ``violations``; each line
starts ``delay:``, ``orderly:``, ``retry:`` or ``txn:``; the transactional feature waits and
judges on its own, at the same time). The load is small beside the main workload's
100 msg/s: about 3 delayed, 5 ordered, 3 retried sends and 3 transactions a second.

The brokers get short delay levels (``DELAY_LEVELS``: a retry waits level 3 + its reconsume
times, 1-2 s here), a short transaction timeout and check interval
(``txn_feature.BROKER_ARGS``) and, for a feature canary, ``--broker-canary``. The clients' log
lines go to ``clients.log`` in the run's directory (``log_to``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from broker.features.retry.model import ORIGIN_MESSAGE_ID, RECONSUME_TIME, UNIQ_KEY, dlq_topic
from chaos.live.checkers.delay import Delivered, check_delayed
from chaos.live.checkers.orderly import check_orderly
from chaos.live.checkers.retry import ALWAYS, DeadLetter, check_retries
from chaos.live.features.clients import (
    DELAY_TOPIC,
    MAX_RECONSUME_TIMES,
    ORDER_TOPIC,
    RETRY_GROUP,
    RETRY_TOPIC,
    SEND_ERRORS,
    FeatureLog,
    churn,
    orderly_member,
    retry_consumer,
    send_delayed,
    send_orders,
    send_retried,
)
from chaos.live.features.txn import BROKER_ARGS as TXN_BROKER_ARGS
from chaos.live.features.txn import TXN_TOPIC, TxnFeature
from chaos.live.nemesis import find_leader
from client.consumer.orderly import OrderlyPushConsumer
from client.consumer.pull import PullConsumer
from client.consumer.push import PushConsumer
from client.producer.producer import Producer
from dledger.client import LogClient
from protocol import broker_kinds as bp

# The seeded broker bugs the features' checkers must catch (given to the brokers as
# --broker-canary; chaos.live.canaries.CANARIES names each one's scenario).
BROKER_CANARIES = frozenset({"delay_early", "timer_redeliver", "lock_unfenced",
                             "retry_count_lost", "txn_half_visible", "txn_forget"})
# A retry waits level 3 + its reconsume times: 1 s, 1.5 s, 2 s, so that a retried message's
# copies span a few seconds and some of them cross each leader change.
DELAY_LEVELS = "100ms 200ms 1s 1500ms 2s 2500ms " + " ".join(["3s"] * 12)
FEATURE_QUEUES = 2
FINISH_WAIT_S = 30.0
READ_WAIT_S = 20.0
ROUTE_WAIT_S = 15.0
LINES_MAX = 10  # violation lines per feature in the run's list (all are counted)


@contextlib.contextmanager
def log_to(path: str) -> Iterator[None]:
    """The client library's log lines (``client.*``: failed pulls, commits, send-backs under the
    faults) into ``path`` rather than the terminal, while the block runs."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logger = logging.getLogger("client")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()


def broker_args(canary: str | None) -> tuple[str, ...]:
    # --no-notify-consumers: a member learns of a rejoining orderly member only at its next
    # heartbeat, so the newcomer asks for queues the holder still processes: the window the
    # queue locks' fencing must close (with notices it is a moment, and lock_unfenced, the
    # fencing removed, went uncaught by S8 in one CI run). Notices are an optimisation only.
    args: tuple[str, ...] = ("--delay-levels", DELAY_LEVELS, "--no-notify-consumers",
                             *TXN_BROKER_ARGS)
    return (*args, "--broker-canary", canary) if canary in BROKER_CANARIES else args


class Features:
    def __init__(self, namesrv: str, control: LogClient, nodes: list[str], rng: random.Random,
                 stop: asyncio.Event, work_dir: str = ".") -> None:
        self.namesrv, self.control, self.nodes, self.rng, self.stop = \
            namesrv, control, nodes, rng, stop
        self.work_dir = work_dir
        self.txn: TxnFeature | None = None
        self.log = FeatureLog()
        self._producer: Producer | None = None
        self._members: dict[str, OrderlyPushConsumer] = {}
        self._retry: PushConsumer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.result: dict[str, Any] = {}
        self.violations: list[str] = []

    async def start(self) -> None:
        for topic in (DELAY_TOPIC, ORDER_TOPIC, RETRY_TOPIC, TXN_TOPIC):
            await self.control.call_leader(bp.TOPIC_PUT, topic, FEATURE_QUEUES, FEATURE_QUEUES, 6,
                                           timeout_s=10.0)
        await self._routed(DELAY_TOPIC, ORDER_TOPIC, RETRY_TOPIC, TXN_TOPIC)
        self._producer = await Producer(self.namesrv, send_timeout_s=3.0).start()
        for member in ("oa", "ob"):
            self._members[member] = orderly_member(self.namesrv, member, self.log,
                                                   random.Random(self.rng.random()))
            await self._members[member].start()
        self._retry = await retry_consumer(self.namesrv, self.log).start()
        rng = random.Random(self.rng.random())
        self._tasks = [asyncio.create_task(c) for c in (
            send_delayed(self._producer, self.log, self.stop, rng),
            send_orders(self._producer, self.log, self.stop, rng),
            send_retried(self._producer, self.log, self.stop),
            churn(self.namesrv, self._members, self.log, self.stop, rng))]
        self.txn = TxnFeature(self.namesrv, self.work_dir, random.Random(self.rng.random()),
                              self.stop, self._rows, self._leader_status, FEATURE_QUEUES)
        await self.txn.start()

    async def _routed(self, *topics: str) -> None:
        """Wait until the NameServer routes each topic (the leader registers a new topic at
        once, but asynchronously): a consumer starting before that would fail."""
        deadline = time.monotonic() + ROUTE_WAIT_S
        async with PullConsumer(self.namesrv, "chaos-features-routes") as pc:
            for topic in topics:
                while True:
                    try:
                        await pc.fetch_queues(topic)
                        break
                    except SEND_ERRORS:
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.2)  # polling interval of a bounded wait

    async def finish(self, path: str | None = None) -> None:
        """After ``stop``: wait for the features' work to end, close the clients, read back,
        judge. A wait that runs out leaves its messages to the checkers (lost, unresolved)."""
        txn = asyncio.create_task(self.txn.finish()) if self.txn is not None else None
        crashed = [r for r in await asyncio.gather(*self._tasks, return_exceptions=True)
                   if isinstance(r, BaseException)]
        took = await self._wait_done()
        await self._close_clients()
        pending = await self._pending()
        letters = await self._retrying(self._dead_letters)
        delivered = await self._retrying(self._delivered)
        log = self.log
        delay = check_delayed(log.delay_acked, delivered or [], nothing_pending=pending == 0)
        if delivered is None:
            delay.append("harness: the delayed topic could not be read back")
        orderly = check_orderly(log.orderly, log.orderly_acked)
        retry = check_retries(log.retry_sent, log.retry_deliveries, letters or [],
                              MAX_RECONSUME_TIMES)
        if letters is None:
            retry.append("harness: the dead-letter queue could not be read back")
        self.result = self._summary(took, pending, delivered or [], letters or [])
        self.result["delay"]["violations"] = len(delay)
        self.result["orderly"]["violations"] = len(orderly)
        self.result["retry"]["violations"] = len(retry)
        self.violations += [f"harness: a feature client failed: {err!r}" for err in crashed]
        judged = [("delay", delay), ("orderly", orderly), ("retry", retry)]
        if txn is not None and self.txn is not None:
            (err,) = await asyncio.gather(txn, return_exceptions=True)
            if isinstance(err, BaseException):
                self.txn.problems.append(f"harness: the transactional feature failed: {err!r}")
            self.result["txn"] = dict(self.txn.result)
            judged.append(("txn", self.txn.problems))
        for name, lines in judged:
            self.violations += [f"{name}: {line}" for line in lines[:LINES_MAX]]
            if len(lines) > LINES_MAX:
                self.violations.append(f"{name}: ... and {len(lines) - LINES_MAX} more")
            self.result[name]["examples"] = lines[:LINES_MAX]
        if path is not None:
            self._write(path)

    def _summary(self, took: float | None, pending: int, delivered: list[Delivered],
                 letters: list[DeadLetter]) -> dict[str, Any]:
        """How much of each feature ran (the report's table)."""
        log = self.log
        return {
            "finished_in_s": took, "timers_pending": pending,
            "delay": {"acked": len(log.delay_acked), "unknown": log.delay_unknown,
                      "delivered": len(delivered)},
            "orderly": {"acked": sum(log.orderly_acked.values()), "calls": len(log.orderly),
                        "processed": len({(p.order_id, p.seq) for p in log.orderly if p.ok}),
                        "rejoins": log.orderly_rejoins},
            "retry": {"acked": len(log.retry_sent), "unknown": log.retry_unknown,
                      "always_failing": sum(1 for s in log.retry_sent.values() if s.plan == ALWAYS),
                      "deliveries": len(log.retry_deliveries),
                      "consumed": len({d.msg_id for d in log.retry_deliveries if d.ok}),
                      "dead_letters": len(letters)},
        }

    async def close(self) -> None:
        """Stop whatever still runs (a harness error cut the run short)."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.txn is not None:
            await self.txn.close()
        await self._close_clients()

    async def _close_clients(self) -> None:
        clients: list[PushConsumer] = [*self._members.values()]
        clients += [self._retry] if self._retry is not None else []
        self._members, self._retry = {}, None
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.close()

    # -- the end of the features' work -----------------------------------------------------------

    async def _wait_done(self) -> float | None:
        """Seconds until every acknowledged ordered message was processed, every retried one
        resolved and no timer pending; None if ``FINISH_WAIT_S`` ran out first."""
        start = time.monotonic()
        while time.monotonic() - start < FINISH_WAIT_S:
            if self._orderly_done() and await self._retry_done() and await self._pending() == 0:
                return round(time.monotonic() - start, 1)
            await asyncio.sleep(0.5)  # polling interval of a bounded wait
        return None

    def _orderly_done(self) -> bool:
        done = {(p.order_id, p.seq) for p in self.log.orderly if p.ok}
        return all((oid, seq) in done for oid, n in self.log.orderly_acked.items()
                   for seq in range(n))

    async def _retry_done(self) -> bool:
        consumed = {d.msg_id for d in self.log.retry_deliveries if d.ok}
        waiting = [s for s in self.log.retry_sent.values()
                   if s.plan != ALWAYS and s.msg_id not in consumed]
        if waiting:
            return False
        try:
            dead = {d.msg_id for d in await self._dead_letters()}
        except SEND_ERRORS:
            return False
        return all(s.msg_id in dead for s in self.log.retry_sent.values() if s.plan == ALWAYS)

    async def _pending(self) -> int:
        """Timers pending in the leader's state (-1: no leader answered)."""
        st = await self._leader_status()
        return -1 if st is None else int(st["timers"]["pending"])

    async def _leader_status(self) -> dict[str, Any] | None:
        leader = await find_leader(self.control, self.nodes)
        if leader is None:
            return None
        try:
            st: dict[str, Any] = await self.control.call(leader, bp.BROKER_STATUS, timeout_s=2.0)
        except SEND_ERRORS:
            return None
        return st

    # -- read-back (from the leader, which serves what it committed) ------------------------------

    async def _retrying(self, read: Callable[[], Awaitable[list[Any]]]) -> list[Any] | None:
        start = time.monotonic()
        while time.monotonic() - start < READ_WAIT_S:
            try:
                return await read()
            except SEND_ERRORS:
                await asyncio.sleep(0.5)  # a back-off before reading again
        return None

    async def _rows(self, topic: str, queue_id: int) -> list[list[Any]]:
        leader = await find_leader(self.control, self.nodes)
        if leader is None:
            raise TimeoutError("no leader to read from")
        rows: list[list[Any]] = []
        offset = 0
        while True:  # each round moves on by at least one message, or ends
            status, nxt, _lo, _hi, got = await self.control.call(
                leader, bp.PULL, topic, queue_id, offset, 512, 4 << 20, 0, ["*"], timeout_s=5.0)
            if status != bp.FOUND or not got:
                return rows
            rows += got
            offset = int(nxt)

    async def _delivered(self) -> list[Delivered]:
        out = []
        for q in range(FEATURE_QUEUES):
            for offset, _body, _tags, _keys, key, props, _born, stored, _oid in \
                    await self._rows(DELAY_TOPIC, q):
                named = dict(map(tuple, props))
                due = str(named.get("TIMER_DELIVER_MS", "-1"))
                out.append(Delivered(str(named.get(UNIQ_KEY, key)), f"{DELAY_TOPIC}/{q}",
                                     int(offset), int(stored),
                                     int(due) if due.lstrip("-").isdigit() else -1))
        return out

    async def _dead_letters(self) -> list[DeadLetter]:
        out = []
        for offset, _body, _tags, _keys, key, props, *_ in \
                await self._rows(dlq_topic(RETRY_GROUP), 0):
            named = dict(map(tuple, props))
            times = str(named.get(RECONSUME_TIME, "0"))
            out.append(DeadLetter(str(named.get(UNIQ_KEY, key)), int(offset),
                                  int(times) if times.isdigit() else -1,
                                  str(named.get(ORIGIN_MESSAGE_ID, ""))))
        return out

    def _write(self, path: str) -> None:
        """The features' record, for diagnosis (one JSON object per line)."""
        log = self.log
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps({"result": self.result}) + "\n")
            for name, items in (("orderly", log.orderly), ("retry", log.retry_deliveries)):
                for item in items:
                    f.write(json.dumps({"f": name, **{k: getattr(item, k)
                                                      for k in item.__slots__}}) + "\n")
            for s in log.retry_sent.values():
                f.write(json.dumps({"f": "retry-sent", "msg_id": s.msg_id, "plan": s.plan,
                                    "offset_msg_id": s.offset_msg_id}) + "\n")
            f.write(json.dumps({"f": "delay-acked", "ids": sorted(log.delay_acked)}) + "\n")
