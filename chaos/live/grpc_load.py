"""RocketMQ 5 clients in a live chaos run (a scenario with ``grpc``, S19 and S20): the official
Python client (PyPI ``rocketmq-python-client``) drives load through the nodes' gRPC endpoints
beside our producers while the nemesis kills or isolates the leader, and its history is judged
by the pop/FIFO checker, the batch checker and the recall and TTL checkers.

The load (``chaos.live.grpc_clients``, each worker a thread of its own):
- a NORMAL producer on ``GRPC_TOPIC`` and two SimpleConsumer members of one group;
- a FIFO producer on ``FIFO_TOPIC`` (message groups ``FIFO_GROUPS`` in runs) and two slow
  SimpleConsumer members of one group, each holding one message at a time;
- batches of ten in one SendMessage on ``BATCH_TOPIC``;
- PRIORITY messages (priorities 0-9 in turn) on ``PRIORITY_TOPIC`` for a slow SimpleConsumer,
  whose backlog makes the leader park the lower priorities (``broker.features.pop.scan``): the
  pop checker finds none of them lost;
- delayed messages, half of them recalled, and messages with a TTL for a slow consumer
  (``chaos.live.grpc_timed``).

After the heal and the recovery the senders stop, the consumers are given ``CATCH_UP_S`` at most
to receive and ack every acknowledged send, and the batch topic is read back from every queue
with our client. Judged (``violations``): the pop checker (no acknowledged send lost, no message
received after its ack was acknowledged), FIFO (never two of one message group in flight, each
group in send order) and the batch checker (every batch stored wholly or not at all, every
acknowledged batch stored once, contiguous in one queue), recall (no recalled message
delivered, none delivered early, none lost that was not recalled) and TTL (none delivered after
it expired, none lost that had not). The seeded bugs the run must catch
(``GRPC_LOAD_CANARIES``): ``fifo_group_overlap`` ("fifo: overlap"), ``grpc_batch_torn``
("batch torn"), ``recall_ignored`` ("recall: delivered"), ``ttl_ignored`` ("ttl: expired")
and ``priority_park_lost`` ("pop: acknowledged send ... never received").

The gRPC listeners are on fixed ports (``ChaosCluster.grpc``), so that a node restarted after a
kill is found at the address the clients were given; the clients reach them directly (not
through the fault proxies): an isolated leader stays reachable and must forward or refuse.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import urllib.request
from typing import Any

from broker.config import GRPC_CANARIES
from chaos.live.checkers.batch import BatchVerdict, Stored, check_batches
from chaos.live.checkers.pop import PopVerdict, check_pop
from chaos.live.grpc_clients import GrpcRecord, consume, produce, send_batches
from chaos.live.grpc_timed import DELAY_TOPIC, TIMED_CANARIES, TTL_PAUSE_S, TTL_TOPIC, TimedLoad
from client import errors
from client.consumer.pull import PullConsumer
from dledger.client import LogClient
from protocol import broker_kinds as bp

__all__ = ["BATCH_TOPIC", "FIFO_TOPIC", "GRPC_LOAD_CANARIES", "GRPC_TOPIC", "TOPIC_QUEUES",
           "GrpcLoad", "start_grpc_load"]

GRPC_TOPIC, FIFO_TOPIC, BATCH_TOPIC = "chaos-5x", "chaos-5x-fifo", "chaos-5x-batch"
PRIORITY_TOPIC = "chaos-5x-priority"
TOPICS = (GRPC_TOPIC, FIFO_TOPIC, BATCH_TOPIC, PRIORITY_TOPIC, DELAY_TOPIC, TTL_TOPIC)
TOPIC_QUEUES = 2
FIFO_GROUPS = ("A", "B", "C", "D")
NORMAL_BACKLOG = 200  # NORMAL messages sent and not yet acked, at most
FIFO_BACKLOG = 12  # FIFO messages sent and not yet acked, at most (the consumers are slow)
INVISIBLE_S = 5
FIFO_PROCESS_S = 0.1  # a FIFO consumer's work on a message, before its ack
PRIORITY_BACKLOG = 60  # PRIORITY messages sent and not yet acked, at most
PRIORITY_PAUSE_S = 1.0  # the PRIORITY consumer between its receives (it lags: a backlog)
OVERTAKEN_BY = 20  # a PRIORITY message received after one sent this much later was parked
CATCH_UP_S = 30.0  # the consumers' catching up after the senders stop, at most
READY_S = 30.0  # the topics routable and every node's gRPC address registered, at most
JOIN_S = 20.0  # a worker's end after it is told to stop (a send under way runs out first)
GRPC_LOAD_CANARIES = GRPC_CANARIES | TIMED_CANARIES | {"fifo_group_overlap", "priority_park_lost"}


class GrpcLoad:
    """The official client's producers and consumers of one run, and their verdicts."""

    def __init__(self, namesrv: str, endpoints: list[str], work_dir: str, seed: int) -> None:
        self.namesrv, self.endpoints = namesrv, endpoints
        self.rec = GrpcRecord(os.path.join(work_dir, "grpc-history.jsonl"))
        self.token = f"{seed % 100000:05d}"
        self.senders: list[threading.Thread] = []
        self.consumers: list[threading.Thread] = []
        self.caught_up = False
        self.stored: list[Stored] = []
        self.problems: list[str] = []  # the run could not judge something (harness)
        self.pop: PopVerdict | None = None
        self.batch: BatchVerdict | None = None
        self.timed = TimedLoad(self.rec, seed)
        self.priority_order: list[int] = []  # PRIORITY messages' send order, as first received
        self._priority_got: set[int] = set()

    def start(self) -> None:
        joined, rec = ";".join(self.endpoints), self.rec

        def worker(name: str, fn: Any, *args: Any) -> threading.Thread:
            def run() -> None:
                try:
                    fn(*args)
                except Exception as err:  # (a worker that dies leaves its part unjudged)
                    with rec.lock:
                        rec.errors.append(f"worker {name} ended: {err!r}"[:300])
            return threading.Thread(target=run, name=f"grpc-{name}", daemon=True)

        self.consumers = [
            *(worker(f"c{k}", consume, joined, rec, f"c{k}", "chaos-5x-g", GRPC_TOPIC, False,
                     INVISIBLE_S, 0.0) for k in range(2)),
            *(worker(f"fc{k}", consume, joined, rec, f"fc{k}", "chaos-5x-fifo-g", FIFO_TOPIC,
                     True, INVISIBLE_S, FIFO_PROCESS_S) for k in range(2)),
            worker("pc", consume, joined, rec, "pc", "chaos-5x-priority-g", PRIORITY_TOPIC,
                   False, INVISIBLE_S, 0.0, PRIORITY_PAUSE_S, self._priority_seen),
            worker("dc", consume, joined, rec, "dc", "chaos-5x-delay-g", DELAY_TOPIC, False,
                   INVISIBLE_S, 0.0, 0.0, self.timed.on_receive),
            worker("tc", consume, joined, rec, "tc", "chaos-5x-ttl-g", TTL_TOPIC, False,
                   INVISIBLE_S, 0.0, TTL_PAUSE_S, self.timed.on_receive)]
        self.senders = [
            worker("p", produce, joined, rec, "p", GRPC_TOPIC, (), NORMAL_BACKLOG),
            worker("fp", produce, joined, rec, "fp", FIFO_TOPIC, FIFO_GROUPS, FIFO_BACKLOG),
            worker("pp", produce, joined, rec, "pp", PRIORITY_TOPIC, (), PRIORITY_BACKLOG, True),
            worker("bp", send_batches, self.endpoints, rec, BATCH_TOPIC, self.token),
            worker("tp", self.timed.send_timed, joined)]
        for t in (*self.consumers, *self.senders):
            t.start()

    async def finish(self) -> None:
        """Stop the senders, give the consumers time to catch up, stop them, read the batch
        topic back (called once every replica has applied the log); a second call does
        nothing."""
        if self.rec.stop_receiving.is_set():
            return
        self.rec.stop_sending.set()
        await asyncio.gather(*(asyncio.to_thread(t.join, JOIN_S) for t in self.senders))
        deadline = time.monotonic() + CATCH_UP_S
        while not self._caught_up() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)  # (polling what the consumers recorded: bounded)
        self.caught_up = self._caught_up()
        await self.stop()
        try:
            self.stored = await _read_stored(self.namesrv, BATCH_TOPIC)
        except Exception as err:  # the topic could not be read: the batch verdict is void
            self.problems.append(f"harness: the batch topic could not be read: {err!r}")

    def _priority_seen(self, m: Any, began_s: float, ended_s: float) -> None:
        """A PRIORITY message received (``consume`` calls it under the lock)."""
        seq = int(m.body.decode().rpartition("-")[2])
        if seq not in self._priority_got:
            self._priority_got.add(seq)
            self.priority_order.append(seq)

    def _caught_up(self) -> bool:
        return self.rec.caught_up() and self.timed.caught_up()

    async def stop(self) -> None:
        """Stop every worker (after a failed run too) and close the history file."""
        self.rec.stop_sending.set()
        self.rec.stop_receiving.set()
        await asyncio.gather(*(asyncio.to_thread(t.join, JOIN_S)
                               for t in (*self.senders, *self.consumers)))
        self.rec.close()

    def violations(self) -> list[str]:
        """The checkers' findings (and what kept them from judging)."""
        rec = self.rec
        with rec.lock:
            self.pop = check_pop(set(rec.sent), list(rec.deliveries), list(rec.acks))
            found = self.problems + [f"grpc: {e}" for e in rec.errors[:5]] + self.pop.lines() \
                + self.timed.violations()
            if not self.problems:
                self.batch = check_batches(dict(rec.batches), set(rec.batches_acked),
                                           self.stored)
                found += self.batch.lines()
        return found

    def summary(self, first_fault_t: float | None = None) -> dict[str, Any]:
        """The counts; with ``first_fault_t`` (wall clock), also the sends acknowledged and the
        FIFO messages received after the first fault began."""
        rec = self.rec
        since = first_fault_t - time.time() + time.monotonic() if first_fault_t else None
        with rec.lock:
            out: dict[str, Any] = {
                "sent": len(rec.sent), "send_failures": rec.send_failures,
                "deliveries": len(rec.deliveries), "acks": sum(1 for a in rec.acks if a.ok),
                "fifo_deliveries": sum(1 for d in rec.deliveries if d.group),
                "batches": len(rec.batches), "batches_acked": len(rec.batches_acked),
                "batch_tries_failed": rec.batch_tries_failed, "caught_up": self.caught_up,
                "priority_overtaken": _overtaken(self.priority_order, OVERTAKEN_BY),
                **self.timed.summary(since)}
            if since is not None:
                out["sent_after_fault"] = sum(1 for t in rec.sent_s if t > since)
                out["fifo_after_fault"] = sum(1 for d in rec.deliveries
                                              if d.group and d.receive_began_s > since)
        if self.pop is not None:
            out["redelivered"] = self.pop.redelivered
            out["fifo_parallel"] = len(self.pop.parallel_s)
        if self.batch is not None:
            out["batches_stored"] = self.batch.present
        return out


async def start_grpc_load(control: LogClient, namesrv: str, endpoints: dict[str, str],
                          work_dir: str, seed: int) -> GrpcLoad:
    """Create the load's topics, wait until the NameServer routes them and lists every node's
    gRPC address (the route answers the clients get name them), start the workers."""
    for topic in TOPICS:
        await control.call_leader(bp.TOPIC_PUT, topic, TOPIC_QUEUES, TOPIC_QUEUES, 6,
                                  timeout_s=10.0)
    deadline = time.monotonic() + READY_S
    async with PullConsumer(namesrv, "chaos-5x-ready", timeout_s=READY_S) as consumer:
        for topic in TOPICS:
            while True:  # the group may not be registered yet (a new leader, a slow box)
                try:
                    await consumer.fetch_queues(topic)
                    break
                except errors.ClientError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)  # (polling the NameServer: bounded)
    while len(await asyncio.to_thread(_registered, namesrv)) < len(endpoints):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the nodes' gRPC addresses were not registered in {READY_S} s")
        await asyncio.sleep(0.2)  # (polling the NameServer: bounded)
    load = GrpcLoad(namesrv, list(endpoints.values()), work_dir, seed)
    load.start()
    return load


def _overtaken(order: list[int], by: int) -> int:
    """How many messages were first received after one sent ``by`` or more places later (a
    lower priority passed over: parked)."""
    top, count = -1, 0
    for seq in order:
        if seq <= top - by:
            count += 1
        top = max(top, seq)
    return count


def _registered(namesrv: str) -> list[str]:
    """The gRPC addresses the NameServer lists."""
    with urllib.request.urlopen(f"http://{namesrv}/v1/cluster", timeout=5) as resp:
        groups = json.loads(resp.read())["groups"]
    return [n["grpc_address"] for g in groups for n in g["nodes"] if n.get("grpc_address")]


async def _read_stored(namesrv: str, topic: str) -> list[Stored]:
    """Every message the topic's queues hold, read from each queue's start with our client."""
    out: list[Stored] = []
    async with PullConsumer(namesrv, "chaos-5x-batch-reader", timeout_s=10.0) as consumer:
        for mq in await consumer.fetch_queues(topic):
            offset = 0
            for _ in range(100_000):  # (bounded: a queue's messages, 64 at a time)
                res = await consumer.pull(mq, offset, 64)
                out += [Stored(m.msg_id, f"{mq.group}/{mq.topic}/{mq.queue_id}", m.queue_offset)
                        for m in res.messages]
                if res.next_offset >= res.max_offset or not res.messages:
                    break
                offset = res.next_offset
    return out
