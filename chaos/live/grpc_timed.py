"""Delayed messages with recalls and messages with a TTL in a live chaos run, sent and received
by the official RocketMQ 5 client (``chaos.live.grpc_load`` starts these workers beside its
others, each a thread of its own) while the leader is killed or isolated; judged by
``chaos.live.checkers.timed``.

- ``send_timed``: one Producer sends, in turn, a DELAY message on ``DELAY_TOPIC`` due
  ``DUE_S`` from now (a delivery timestamp) and a message with a TTL on ``TTL_TOPIC``, its TTL
  ``TTL_SHORT_MS`` or, every other one, ``TTL_KEPT_MS`` (longer than any run: those must all be
  received). It recalls ``RECALL_SHARE`` of the delayed messages by the recall handle their send
  answered with, each once, at a random moment from just after its send to a little past its
  due time (so that some recalls come after the delivery and are refused).
- The delayed topic's consumer receives at the load's normal pace; the TTL topic's is slow: it
  pauses ``TTL_PAUSE_S`` between receives, longer than the short TTL, so that some messages
  expire before it asks for them.

``TimedLoad`` holds what was sent, the recalls' outcomes and every delivery of the two topics
(recorded through ``consume``'s ``on_receive``), under the run's ``GrpcRecord`` lock, and each
event goes to the run's history file. Its seeded bugs: ``recall_ignored`` ("recall:
delivered"), ``ttl_ignored`` ("ttl: expired").
"""

from __future__ import annotations

import heapq
import random
import time
from dataclasses import dataclass, field
from typing import Any

from rocketmq import Message as RmqMessage
from rocketmq import Producer as RmqProducer

from chaos.live.checkers.timed import RecallVerdict, Seen, TtlVerdict, check_recall, check_ttl
from chaos.live.grpc_clients import GrpcRecord, client_config, started
from protocol.message_ttl import TTL_PROPERTY, ttl_of

__all__ = ["DELAY_TOPIC", "TIMED_CANARIES", "TTL_PAUSE_S", "TTL_TOPIC", "TimedLoad"]

DELAY_TOPIC, TTL_TOPIC = "chaos-5x-delay", "chaos-5x-ttl"
DUE_S = (2.0, 4.0)  # a delayed message is due this long after its send (uniform)
RECALL_SHARE = 0.5  # of the delayed messages, recalled
RECALL_LATE_S = 0.5  # a recall may come this long past its message's due time (refused)
TTL_SHORT_MS = 1000
TTL_KEPT_MS = 600_000  # outlasts any run: such a message must be received
TTL_PAUSE_S = 1.5  # the TTL topic's consumer between its receives (longer than the short TTL)
PACE_S = 0.15  # between the producer's rounds (a delayed send and a TTL send)
DUE_PASSED_MS = 1000  # caught up only once every delayed message is this far past its due time
TIMED_CANARIES = frozenset({"recall_ignored", "ttl_ignored"})


@dataclass
class TimedLoad:
    """The delayed and TTL sends of one run, the recalls, and the deliveries; every field is
    read and written under ``rec.lock``."""

    rec: GrpcRecord
    seed: int
    due_ms: dict[str, int] = field(default_factory=dict)  # acknowledged delayed send -> due
    recalls: dict[str, str] = field(default_factory=dict)  # message id -> ok/refused/unknown
    recalled_s: list[float] = field(default_factory=list)  # monotonic, each recall acknowledged
    kept: set[str] = field(default_factory=set)  # acknowledged sends of TTL_KEPT_MS
    short: int = 0  # acknowledged sends of TTL_SHORT_MS
    send_failures: int = 0
    delayed_seen: list[Seen] = field(default_factory=list)
    ttl_seen: list[Seen] = field(default_factory=list)
    recall: RecallVerdict | None = None
    ttl: TtlVerdict | None = None

    def on_receive(self, m: Any, began_s: float, ended_s: float) -> None:
        """A delivery of either topic (``consume`` calls it under the lock)."""
        store = getattr(m, "_Message__store_timestamp", None)  # (the client keeps it private)
        props = [(k, v) for k, v in (m.properties or {}).items()]
        s = Seen(m.message_id, began_s * 1000, ended_s * 1000, store,
                 ttl_of(props) if props else None, m.delivery_timestamp)
        (self.delayed_seen if m.topic == DELAY_TOPIC else self.ttl_seen).append(s)

    def caught_up(self) -> bool:
        """Every delayed message past its due time (a recalled one would have come), and every
        one that must be received, received and an ack sent for it."""
        with self.rec.lock:
            acked = {a.message_id for a in self.rec.acks}
            must = {m for m in self.due_ms if m not in self.recalls} | self.kept
            last_due = max(self.due_ms.values(), default=0)
        return must <= acked and time.time() * 1000 > last_due + DUE_PASSED_MS

    def violations(self) -> list[str]:
        """The checkers' findings (the caller holds the lock)."""
        self.recall = check_recall(dict(self.due_ms), dict(self.recalls), self.delayed_seen)
        self.ttl = check_ttl(set(self.kept), self.ttl_seen)
        return self.recall.lines() + self.ttl.lines()

    def summary(self, since_s: float | None = None) -> dict[str, Any]:
        """The counts; with ``since_s`` (monotonic), also the recalls acknowledged after it
        (the caller holds the lock)."""
        outcomes = list(self.recalls.values())
        out: dict[str, Any] = {
            "delayed": len(self.due_ms), "recalled": outcomes.count("ok"),
            "recalls_refused": outcomes.count("refused"),
            "recalls_unknown": outcomes.count("unknown"), "ttl_kept": len(self.kept),
            "ttl_short": self.short, "timed_send_failures": self.send_failures}
        if since_s is not None:
            out["recalled_after_fault"] = sum(1 for t in self.recalled_s if t > since_s)
        if self.recall is not None:
            out["delayed_received"] = self.recall.received
        if self.ttl is not None:
            short_got = len({s.message_id for s in self.ttl_seen if s.ttl_ms == TTL_SHORT_MS})
            out["ttl_short_received"] = short_got
        return out

    # -- the producer's thread ------------------------------------------------------------------

    def send_timed(self, endpoints: str) -> None:
        """Sends and recalls until ``rec.stop_sending``."""
        rec, rng = self.rec, random.Random(f"timed-{self.seed}")
        producer = started(RmqProducer(client_config(endpoints), [DELAY_TOPIC, TTL_TOPIC]))
        planned: list[tuple[float, str, str]] = []  # (when, message id, recall handle)
        try:
            k = 0
            while not rec.stop_sending.is_set():
                self._delayed(producer, k, rng, planned)
                self._with_ttl(producer, k)
                while planned and planned[0][0] <= time.monotonic() \
                        and not rec.stop_sending.is_set():
                    _, mid, handle = heapq.heappop(planned)
                    self._recall(producer, mid, handle)
                k += 1
                rec.stop_sending.wait(PACE_S)  # pacing the offered load
        finally:
            producer.shutdown()

    def _send(self, producer: RmqProducer, m: RmqMessage, kind: str) -> Any:
        """One send; None when the client raised (its outcome unknown)."""
        try:
            return producer.send(m)
        except Exception as err:  # the client's own errors: the outcome is unknown
            with self.rec.lock:
                self.send_failures += 1
                self.rec.log(proc="timed", f="send", type="info", kind=kind,
                             error=type(err).__name__)
            return None

    def _delayed(self, producer: RmqProducer, k: int, rng: random.Random,
                 planned: list[tuple[float, str, str]]) -> None:
        delay_s = rng.uniform(*DUE_S)
        due_ms = int((time.time() + delay_s) * 1000)
        m = RmqMessage()
        m.topic, m.body = DELAY_TOPIC, f"delayed-{k:06d}".encode()
        m.delivery_timestamp = due_ms
        recall = rng.random() < RECALL_SHARE
        recall_in_s = rng.uniform(0.1, delay_s + RECALL_LATE_S)
        receipt = self._send(producer, m, "delayed")
        if receipt is None:
            return
        with self.rec.lock:
            self.due_ms[receipt.message_id] = due_ms
            self.rec.log(proc="timed", f="send", type="ok", kind="delayed",
                         id=receipt.message_id, due_ms=due_ms)
        if recall and receipt.recall_handle:
            heapq.heappush(planned, (time.monotonic() + recall_in_s, receipt.message_id,
                                     receipt.recall_handle))

    def _recall(self, producer: RmqProducer, mid: str, handle: str) -> None:
        try:
            producer.recall_message(DELAY_TOPIC, handle)
            outcome, error = "ok", ""
        except Exception as err:  # refused by name, or no answer (unknown)
            error = str(err)
            outcome = "refused" if "NOT_RECALLABLE" in error else "unknown"
        with self.rec.lock:
            self.recalls[mid] = outcome
            if outcome == "ok":
                self.recalled_s.append(time.monotonic())
            self.rec.log(proc="timed", f="recall", id=mid, outcome=outcome, error=error[:200])

    def _with_ttl(self, producer: RmqProducer, k: int) -> None:
        ttl_ms = TTL_KEPT_MS if k % 2 else TTL_SHORT_MS
        m = RmqMessage()
        m.topic, m.body = TTL_TOPIC, f"ttl-{k:06d}".encode()
        m.add_property(TTL_PROPERTY, str(ttl_ms))
        receipt = self._send(producer, m, "ttl")
        if receipt is None:
            return
        with self.rec.lock:
            if ttl_ms == TTL_KEPT_MS:
                self.kept.add(receipt.message_id)
            else:
                self.short += 1
            self.rec.log(proc="timed", f="send", type="ok", kind="ttl", id=receipt.message_id,
                         ttl_ms=ttl_ms)
