"""The clients of the live chaos run's messaging features (``chaos.live.features.driver``): what they send
and how their listeners answer, each recording what the features' checkers read.

- delayed sends: messages due 0.2-2.5 s ahead (by time, or by one of the short delay levels);
  each acknowledged id is recorded;
- ordered sends: a few order ids, each one's messages sent one after the other through the queue
  selector (a send that fails is sent again until it is acknowledged, so an order id's
  acknowledged messages are 0..n-1); two orderly members process them, each call recorded
  (``Processing``), one member leaving and coming back every few seconds so that queues change
  hands under the faults;
- retried messages: message *i* planned to fail 0, 1, 2 times or always (``PLANS``); the push
  consumer's listener answers by copy (``chaos.live.checkers.retry.fails``), each delivery
  recorded.

Owns no verdict. Every loop ends on its stop event; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

from chaos.live.checkers.orderly import Processing
from chaos.live.checkers.retry import ALWAYS, RetryDelivery, RetrySent, fails
from client import errors
from client.consumer.orderly import OrderlyPushConsumer
from client.consumer.push import PushConsumer
from client.producer.producer import Producer
from client.types import ConsumeStatus, Message, ReceivedMessage
from protocol.errors import DLedgerError

DELAY_TOPIC = "chaos-delay"
ORDER_TOPIC = "chaos-orders"
RETRY_TOPIC = "chaos-retry"
ORDER_GROUP = "chaos-orderly"
RETRY_GROUP = "chaos-retried"
MAX_RECONSUME_TIMES = 3
PLANS = (0, 1, 2, ALWAYS)  # message i's plan: PLANS[i % 4]
ORDER_IDS = 8
DELAY_PAUSE_S = 0.3  # about 3 delayed sends a second
ORDER_PAUSE_S = 1.6  # each order id's pace: 8 ids, about 5 sends a second
RETRY_PAUSE_S = 0.35  # about 3 retried messages a second
WORK_S = (0.05, 0.1)  # an orderly listener's processing time: queues are often busy
CHURN_S = 8.0  # an orderly member leaves this often ...
AWAY_S = 2.5  # ... for this long (past the other member's heartbeat: it takes the queues)
SEND_ERRORS = (errors.ClientError, asyncio.TimeoutError, DLedgerError, OSError)


@dataclass
class FeatureLog:
    """What the features' clients recorded."""

    delay_acked: dict[str, int] = field(default_factory=dict)  # msg id -> due (-1: by property)
    delay_unknown: int = 0  # sends whose outcome is unknown (not checked)
    orderly: list[Processing] = field(default_factory=list)
    orderly_acked: dict[str, int] = field(default_factory=dict)  # order id -> messages acked
    orderly_rejoins: int = 0
    retry_sent: dict[str, RetrySent] = field(default_factory=dict)
    retry_deliveries: list[RetryDelivery] = field(default_factory=list)
    retry_unknown: int = 0


async def _pause(stop: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds`` (the senders' pacing) or until ``stop``; True while not stopped."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass
    return not stop.is_set()


async def send_delayed(prod: Producer, log: FeatureLog, stop: asyncio.Event,
                       rng: random.Random) -> None:
    k = 0
    while await _pause(stop, DELAY_PAUSE_S):
        k += 1
        body = f"d{k}".encode()
        m = Message(DELAY_TOPIC, body, delay_level=rng.randint(1, 6)) if k % 4 == 0 else \
            Message(DELAY_TOPIC, body, delay_ms=rng.randint(200, 2500))
        try:
            r = await asyncio.wait_for(prod.send(m), 6.0)
        except SEND_ERRORS:
            log.delay_unknown += 1
            continue
        log.delay_acked[r.msg_id] = -1


async def send_orders(prod: Producer, log: FeatureLog, stop: asyncio.Event,
                      rng: random.Random) -> None:
    async def one(oid: str) -> None:
        seq = 0
        await _pause(stop, rng.uniform(0, ORDER_PAUSE_S))  # spread the ids' sends
        while not stop.is_set():
            try:
                await asyncio.wait_for(prod.send_orderly(
                    Message(ORDER_TOPIC, f"{oid}:{seq}".encode()), oid), 6.0)
            except SEND_ERRORS:
                await _pause(stop, 0.2)  # sent again (the same seq) until acknowledged
                continue
            seq += 1
            log.orderly_acked[oid] = seq
            await _pause(stop, ORDER_PAUSE_S)
    await asyncio.gather(*(one(f"o{k}") for k in range(ORDER_IDS)))


async def send_retried(prod: Producer, log: FeatureLog, stop: asyncio.Event) -> None:
    i = 0
    while await _pause(stop, RETRY_PAUSE_S):
        plan = PLANS[i % len(PLANS)]
        try:
            r = await asyncio.wait_for(prod.send(Message(RETRY_TOPIC, f"r{i}|{plan}".encode())),
                                       6.0)
        except SEND_ERRORS:
            log.retry_unknown += 1
        else:
            log.retry_sent[r.msg_id] = RetrySent(r.msg_id, plan, r.offset_msg_id)
        i += 1


class OrderlyListener:
    """Records every call; fails one message in seven once (SUSPEND, retried in place)."""

    def __init__(self, member: str, log: FeatureLog, rng: random.Random) -> None:
        self.member, self.log, self.rng = member, log, rng
        self.failed: set[bytes] = set()

    async def __call__(self, batch: list[ReceivedMessage]) -> ConsumeStatus:
        (m,) = batch
        start = time.monotonic_ns()
        await asyncio.sleep(self.rng.uniform(*WORK_S))  # the work: a processing interval
        order_id, _, seq = m.body.decode(errors="replace").partition(":")
        ok = not (int(seq) % 7 == 3 and m.body not in self.failed)
        if not ok:
            self.failed.add(m.body)
        self.log.orderly.append(Processing(self.member, f"{m.queue.group}/{m.queue.queue_id}",
                                           m.queue_offset, order_id, int(seq), start,
                                           time.monotonic_ns(), ok))
        return ConsumeStatus.SUCCESS if ok else ConsumeStatus.SUSPEND


def orderly_member(namesrv: str, member: str, log: FeatureLog,
                   rng: random.Random) -> OrderlyPushConsumer:
    c = OrderlyPushConsumer(namesrv, ORDER_GROUP, OrderlyListener(member, log, rng),
                            client_id=member, suspend_s=0.05, heartbeat_s=1.0, rebalance_s=2.0,
                            commit_s=1.0, suspend_ms=500, start_from="first")
    c.subscribe(ORDER_TOPIC)
    return c


async def churn(namesrv: str, members: dict[str, OrderlyPushConsumer], log: FeatureLog,
                stop: asyncio.Event, rng: random.Random) -> None:
    """Every ``CHURN_S``: member ``ob`` leaves (its queues handed over), comes back after
    ``AWAY_S`` (with the same client id) and takes its share again."""
    while await _pause(stop, CHURN_S):
        await members["ob"].close()
        await asyncio.sleep(AWAY_S)  # away: the other member takes every queue
        members["ob"] = orderly_member(namesrv, "ob", log, rng)
        try:
            await members["ob"].start()
        except SEND_ERRORS:
            continue  # no NameServer answered: the next round tries again
        log.orderly_rejoins += 1


class RetryListener:
    """Answers by copy: copy k of a message (its k-th distinct stored copy) fails iff k is below
    the message's plan; every delivery is recorded."""

    def __init__(self, log: FeatureLog) -> None:
        self.log = log
        self.copies: dict[str, list[str]] = {}  # msg id -> its copies, in delivery order

    def __call__(self, batch: list[ReceivedMessage]) -> ConsumeStatus:
        (m,) = batch
        copy = f"{m.queue.topic}/{m.queue.group}/{m.queue.queue_id}@{m.queue_offset}"
        seen = self.copies.setdefault(m.msg_id, [])
        if copy not in seen:
            seen.append(copy)
        _, _, plan = m.body.decode(errors="replace").partition("|")
        ok = not fails(seen.index(copy), int(plan))
        self.log.retry_deliveries.append(RetryDelivery(m.msg_id, copy, m.reconsume_times, ok,
                                                       time.monotonic()))
        return ConsumeStatus.SUCCESS if ok else ConsumeStatus.LATER


def retry_consumer(namesrv: str, log: FeatureLog) -> PushConsumer:
    c = PushConsumer(namesrv, RETRY_GROUP, RetryListener(log), client_id="r0",
                     max_reconsume_times=MAX_RECONSUME_TIMES, heartbeat_s=1.0, rebalance_s=2.0,
                     commit_s=1.0, suspend_ms=500, later_delay_s=0.5, start_from="first")
    c.subscribe(RETRY_TOPIC)
    return c
