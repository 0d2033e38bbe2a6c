"""The official RocketMQ 5 client's workers in a live chaos run (``chaos.live.grpc_load`` starts
them): each a thread of its own, since the client (PyPI ``rocketmq-python-client``) is
synchronous and runs threads of its own, so that it never blocks the runner's event loop. Every
worker records what it saw into one ``GrpcRecord`` (under its lock), for the pop/FIFO checker and
the batch checker (``chaos.live.checkers.pop``, ``chaos.live.checkers.batch``), and appends each
event to the run's ``grpc-history.jsonl`` as it happens.

- ``produce``: the client's Producer, one sync send at a time; NORMAL messages, FIFO ones
  (``groups``: runs of ``FIFO_RUN`` messages of one message group, then the next group) or
  PRIORITY ones (a slow consumer's backlog makes the broker park the lower ones), each
  body ``<group>-<seq>`` (``seq`` counts the producer's sends: a group's order is its send
  order). A send the client raised on has an unknown outcome: not counted as sent. At most
  ``backlog`` messages sent and not yet acknowledged by a consumer (the consumers are slow).
- ``consume``: a SimpleConsumer member of a consumer group: receives, works ``process_s`` on
  each message, acks it; every receive's start and end, every ack's sending, answer and outcome.
- ``send_batches``: batches of ``BATCH`` NORMAL messages in one SendMessage (the client 5.1.2
  sends one message per call: the protocol's generated stubs, as the client would call them),
  each batch tried again with the same message ids (the broker deduplicates them) on the next
  endpoint until acknowledged or ``BATCH_DEADLINE_S`` has passed.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

import grpc
from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer
from rocketmq import Message as RmqMessage
from rocketmq import Producer as RmqProducer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as sv
from rocketmq.grpc_protocol import service_pb2_grpc as sg
from rocketmq.v5.client.connection.rpc_client import RpcClient

from chaos.live.checkers.pop import Ack, Delivery

__all__ = ["BATCH", "GrpcRecord", "ack_timed", "client_config", "consume", "on_the_client_loop",
           "produce", "send_batches", "started"]

T = TypeVar("T")

FIFO_RUN = 3  # FIFO messages of one group sent in a row: A A A B B B ...
BATCH = 10  # messages in one batch SendMessage
BATCH_DEADLINE_S = 10.0  # a batch is tried again until acknowledged or this has passed
BATCH_PAUSE_S = 0.1  # between batches (the offered load) and between tries of one batch
SEND_TIMEOUT_S = 5.0  # a raw batch call's deadline
RECEIVE_BATCH = 8  # messages one receive may return (a FIFO consumer's: 1)
PRIORITY_STEP = 7  # a PRIORITY producer's messages: priorities 0 7 4 1 8 5 2 9 6 3 0 ...


@dataclass
class GrpcRecord:
    """What the workers saw; every field is read and written under ``lock``."""

    path: str  # grpc-history.jsonl
    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: set[str] = field(default_factory=set)  # message ids whose send was acknowledged
    sent_s: list[float] = field(default_factory=list)  # monotonic, when each was acknowledged
    send_failures: int = 0  # sends the client raised on (outcome unknown)
    deliveries: list[Delivery] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    batches: dict[str, list[str]] = field(default_factory=dict)  # batch id -> its message ids
    batches_acked: set[str] = field(default_factory=set)
    batch_tries_failed: int = 0
    errors: list[str] = field(default_factory=list)  # what a delivery carried wrongly
    stop_sending: threading.Event = field(default_factory=threading.Event)
    stop_receiving: threading.Event = field(default_factory=threading.Event)
    _f: IO[str] | None = None

    def __post_init__(self) -> None:
        self._f = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def log(self, **event: Any) -> None:
        """One event into the history file (the caller holds the lock)."""
        if self._f is not None:
            self._f.write(json.dumps({"t": time.time(), **event}) + "\n")

    def acked_ids(self) -> set[str]:
        """Messages whose ack the broker acknowledged (the caller holds the lock)."""
        return {a.message_id for a in self.acks if a.ok}

    def caught_up(self) -> bool:
        """Every acknowledged send received and an ack sent for it (an ack whose answer was lost
        may have been applied: its message does not come again; one not applied makes it come
        again after its invisible time, and holds its FIFO group's next messages back)."""
        with self.lock:
            return self.sent <= {a.message_id for a in self.acks}

    def close(self) -> None:
        with self.lock:
            if self._f is not None:
                self._f.close()
                self._f = None


def on_the_client_loop() -> None:
    """Makes the official library's own I/O loop the calling thread's current event loop, as
    the library does itself whenever it opens a channel in that thread. A route it fetches
    for a caller is handled in the caller's thread when the answer came before the callback was
    added (our endpoint answers fast), and then the telemetry stream to the route's nodes is
    built there through ``asyncio.get_event_loop()``; a worker thread has no current loop, nor
    has a thread after ``asyncio.run``, and the library then fails the route ("There is no
    current event loop"), as a CI run once showed."""
    loop = RpcClient.get_channel_io_loop()
    if loop is not None:
        asyncio.set_event_loop(loop)


def started(client: T) -> T:
    """``client`` (a Producer or SimpleConsumer of the official library, just made) started
    in this thread with the library's loop current (``on_the_client_loop``)."""
    on_the_client_loop()
    client.startup()  # type: ignore[attr-defined]
    return client


def client_config(endpoints: str) -> ClientConfiguration:
    """The official client's configuration for these endpoints (no credentials)."""
    return ClientConfiguration(endpoints, Credentials())


def produce(endpoints: str, rec: GrpcRecord, proc: str, topic: str, groups: tuple[str, ...],
            backlog: int, priorities: bool = False) -> None:
    """Sends until ``rec.stop_sending`` (FIFO with ``groups``; PRIORITY with ``priorities``,
    each message's priority ``PRIORITY_STEP`` on from the last's, modulo 10; else NORMAL)."""
    producer = started(RmqProducer(client_config(endpoints), [topic]))
    try:
        k, mine = 0, set[str]()
        while not rec.stop_sending.is_set():
            with rec.lock:
                room = len(mine - rec.acked_ids()) < backlog
            if not room:
                rec.stop_sending.wait(0.05)  # (the consumers are behind: polled, bounded by stop)
                continue
            group = groups[(k // FIFO_RUN) % len(groups)] if groups else proc
            m = RmqMessage()
            m.topic, m.body = topic, f"{group}-{k:06d}".encode()
            if groups:
                m.message_group = group
            if priorities:
                m.priority = k * PRIORITY_STEP % 10
            k += 1
            try:
                receipt = producer.send(m)
            except Exception as err:  # the client's own errors: the outcome is unknown
                with rec.lock:
                    rec.send_failures += 1
                    rec.log(proc=proc, f="send", type="info", body=m.body.decode(),
                            error=type(err).__name__)
                continue
            mine.add(receipt.message_id)
            with rec.lock:
                rec.sent.add(receipt.message_id)
                rec.sent_s.append(time.monotonic())
                rec.log(proc=proc, f="send", type="ok", body=m.body.decode(),
                        id=receipt.message_id)
    finally:
        producer.shutdown()


def _fifo_place(rec: GrpcRecord, m: Any) -> tuple[str, int]:
    """A FIFO message's group and place in its producer's send order, from its body (and a note
    of a message the broker gave another group than its body names)."""
    group, seq = m.body.decode().split("-")
    if group != m.message_group:
        rec.errors.append(f"{m.body!r} came with the message group {m.message_group!r}")
    return group, int(seq)


def consume(endpoints: str, rec: GrpcRecord, proc: str, group: str, topic: str, fifo: bool,
            invisible_s: int, process_s: float, pause_s: float = 0.0,
            on_receive: Callable[[Any, float, float], None] | None = None) -> None:
    """A member of ``group`` until ``rec.stop_receiving``; ``pause_s`` between its receives (a
    slow consumer); ``on_receive`` is told of each message received, with the wall-clock times
    its receive call began and returned (under the lock)."""
    consumer = started(SimpleConsumer(client_config(endpoints), group, {topic: FilterExpression()},
                                      await_duration=1))
    try:
        while not rec.stop_receiving.is_set():
            began, began_wall = time.monotonic(), time.time()
            try:
                messages = consumer.receive(1 if fifo else RECEIVE_BATCH, invisible_s)
            except Exception:  # a receive under the fault: try again
                rec.stop_receiving.wait(0.05)  # (a client's back-off, bounded by the stop)
                continue
            ended, ended_wall = time.monotonic(), time.time()
            with rec.lock:
                for m in messages:
                    if on_receive is not None:
                        on_receive(m, began_wall, ended_wall)
                    place = _fifo_place(rec, m) if fifo else ("", -1)
                    rec.deliveries.append(Delivery(m.message_id, began, m.delivery_attempt or 1,
                                                   ended, *place))
                    rec.log(proc=proc, f="receive", id=m.message_id, attempt=m.delivery_attempt,
                            group=place[0], seq=place[1], began=began, ended=ended)
            for m in messages:
                if process_s:
                    rec.stop_receiving.wait(process_s)  # the consumer's work on it
                ack = ack_timed(consumer, m)
                with rec.lock:
                    rec.acks.append(ack)
                    rec.log(proc=proc, f="ack", id=m.message_id, ok=ack.ok, sent=ack.sent_s)
            if pause_s:
                rec.stop_receiving.wait(pause_s)  # a slow consumer (bounded by the stop)
    finally:
        consumer.shutdown()


def ack_timed(consumer: Any, m: Any) -> Ack:
    """Ack ``m`` with a SimpleConsumer: when the ack was sent, when its answer came, and whether
    the broker acknowledged it (a refused or unanswered ack may come again)."""
    sent = time.monotonic()
    try:
        consumer.ack(m)
        ok = True
    except Exception:  # not acknowledged (or its answer lost): it may come again
        ok = False
    return Ack(m.message_id, time.monotonic(), sent, ok)


def _batch(topic: str, token: str, k: int) -> list[Any]:
    out = []
    for i in range(BATCH):
        m = pb.Message(body=f"{token}-{k}-{i}".encode())
        m.topic.name = topic
        m.system_properties.message_id = f"B{token}{k:06d}{i:02d}"
        m.system_properties.message_type = pb.MessageType.NORMAL
        out.append(m)
    return out


def send_batches(endpoints: list[str], rec: GrpcRecord, topic: str, token: str) -> None:
    """Batches until ``rec.stop_sending``; ``token`` makes the run's message ids its own."""
    channels = [grpc.insecure_channel(a) for a in endpoints]
    stubs = [sg.MessagingServiceStub(c) for c in channels]
    meta = [("x-mq-client-id", f"chaos-batches-{token}")]
    try:
        k, at = 0, 0
        while not rec.stop_sending.is_set():
            messages = _batch(topic, token, k)
            batch_id = f"B{token}{k:06d}"
            with rec.lock:
                rec.batches[batch_id] = [m.system_properties.message_id for m in messages]
            deadline = time.monotonic() + BATCH_DEADLINE_S
            while time.monotonic() < deadline and not rec.stop_sending.is_set():
                try:
                    answer = stubs[at % len(stubs)].SendMessage(
                        sv.SendMessageRequest(messages=messages), timeout=SEND_TIMEOUT_S,
                        metadata=meta)
                    ok = answer.status.code == pb.Code.OK
                except grpc.RpcError:  # the node is down or cut off: unknown, try the next
                    ok = False
                with rec.lock:
                    rec.log(proc="batches", f="batch", id=batch_id, ok=ok,
                            endpoint=endpoints[at % len(stubs)])
                    if ok:
                        rec.batches_acked.add(batch_id)
                        break
                    rec.batch_tries_failed += 1
                at += 1
                rec.stop_sending.wait(BATCH_PAUSE_S)  # (a client's back-off between tries)
            k += 1
            rec.stop_sending.wait(BATCH_PAUSE_S)  # pacing the offered load
    finally:
        for c in channels:
            c.close()
