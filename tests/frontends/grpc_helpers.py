"""Helpers of the RocketMQ 5 client tests (``tests/frontends/test_grpc_*.py``, the chaos and
bench neighbours): the official Python client's producer and simple consumer as the tests start
them, our client's reads and sends beside them, and a call retried while a killed node's address
answers UNAVAILABLE."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    SimpleConsumer,
)
from rocketmq import Message as RmqMessage
from rocketmq import Producer as RmqProducer

from chaos.live.grpc_clients import started as start_in_this_thread
from client import Message, Producer, PullConsumer, ReceivedMessage

T = TypeVar("T")


STARTUP_ATTEMPTS = 2


def started(new: Callable[[], T]) -> T:
    """A client of the official library made by ``new()`` and started in this thread with the
    library's loop current (``chaos.live.grpc_clients.started``). Its ``startup`` waits a
    fixed 10 s for the settings our endpoint answers as the client's telemetry stream opens; on
    a loaded CI machine that wait ran out once, with nothing wrong on our side. A client whose
    startup raised is shut down (its own cleanup may raise too: it never finished starting) and
    a fresh one started, once; the first failure is reported as a warning, so that it shows in
    the run's summary instead of passing unseen."""
    for attempt in range(1, STARTUP_ATTEMPTS + 1):
        client = new()
        try:
            return start_in_this_thread(client)
        except Exception as err:  # (the library raises plain Exception: its docstring says so)
            cleanup = ""
            try:
                client.shutdown()  # type: ignore[attr-defined]
            except Exception as failed:  # (a half-started client's cleanup: said, not kept)
                cleanup = f"; its shutdown then raised {failed!r}"
            if attempt == STARTUP_ATTEMPTS:
                raise
            warnings.warn(f"{type(client).__name__}.startup failed, started again: {err!r}"
                          f"{cleanup}", stacklevel=2)
    raise AssertionError("unreachable")


def rmq_producer(endpoints: str, topics: list[str]) -> RmqProducer:
    return started(lambda: RmqProducer(ClientConfiguration(endpoints, Credentials()), topics))


async def read_all(ns: str, topic: str, count: int, timeout_s: float = 20) -> list[ReceivedMessage]:
    """``count`` messages of ``topic`` read with our own client, from every queue's start."""
    got: list[ReceivedMessage] = []
    async with PullConsumer(ns, "interop-reader") as consumer:
        deadline = time.monotonic() + timeout_s
        while len(got) < count:
            assert time.monotonic() < deadline, f"read {len(got)} of {count}"
            got = []
            for mq in await consumer.fetch_queues(topic):
                offset = 0
                while True:
                    res = await consumer.pull(mq, offset, 64)
                    got.extend(res.messages)
                    if res.next_offset >= res.max_offset or not res.messages:
                        break
                    offset = res.next_offset
            if len(got) < count:
                await asyncio.sleep(0.05)
    return got


def send_ours(ns: str, messages: list[Message]) -> None:
    async def run() -> None:
        async with Producer(ns) as p:
            for m in messages:
                await p.send(m)
    asyncio.run(run())


def simple_consumer(endpoints: str, group: str, topic: str, await_s: int = 2) -> SimpleConsumer:
    return started(lambda: SimpleConsumer(ClientConfiguration(endpoints, Credentials()), group,
                                          {topic: FilterExpression()}, await_duration=await_s))


def receive_until(consumer: SimpleConsumer, count: int, invisible_s: int,
                  timeout_s: float = 30) -> list[Any]:
    """Messages received until ``count`` (each receive long-polls at most ``await_s``). A
    receive the client sent to a node that is down (its route lists every node, a killed one
    until the route is read again) fails UNAVAILABLE and is asked again, as an application
    would."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        assert time.monotonic() < deadline, f"received {len(got)} of {count}"
        got.extend(receive_or_none(consumer, 16, invisible_s))
    return got


def answered(call: Callable[[], T], timeout_s: float = 30) -> T:
    """``call()``'s answer, asked again while it fails UNAVAILABLE (the client picked a node that
    is down), within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() >= deadline:
                raise


def receive_or_none(consumer: SimpleConsumer, count: int, invisible_s: int) -> list[Any]:
    """One receive; nothing when the client's call went to a node that is down (UNAVAILABLE)."""
    try:
        return list(consumer.receive(count, invisible_s))
    except grpc.aio.AioRpcError as err:
        if err.code() != grpc.StatusCode.UNAVAILABLE:
            raise
        return []


def receive_by_group(endpoints: str, group: str, topic: str, count: int) -> dict[str, list[str]]:
    """``count`` messages received by a simple consumer and acked, their bodies by message
    group in the order received; never two of one group in one receive."""
    consumer = simple_consumer(endpoints, group, topic, await_s=1)
    try:
        seen: dict[str, list[str]] = {}
        deadline = time.monotonic() + 30
        while sum(map(len, seen.values())) < count:
            assert time.monotonic() < deadline, seen
            batch = consumer.receive(16, 10)
            groups = [m.message_group for m in batch]
            assert len(groups) == len(set(groups)), f"two of one group at once: {groups}"
            for m in batch:
                seen.setdefault(m.message_group, []).append(m.body.decode())
                consumer.ack(m)
        return seen
    finally:
        consumer.shutdown()


def send_delayed(producer: RmqProducer, topic: str, body: bytes, delay_ms: int) -> int:
    """``body`` sent to ``topic``, due ``delay_ms`` from now: its due time (ms)."""
    m = RmqMessage()
    m.topic, m.body = topic, body
    due_ms = int(time.time() * 1000) + delay_ms
    m.delivery_timestamp = due_ms  # (the client's unit: ms)
    producer.send(m)
    return due_ms


async def _leader_nodes(ns: str) -> dict[str, tuple[str, int]]:
    """The group's nodes' client addresses, as the NameServer lists them."""
    with urllib.request.urlopen(f"http://{ns}/v1/cluster", timeout=5) as resp:
        groups = json.loads(resp.read())["groups"]
    return {n["node_id"]: (n["client_address"].rpartition(":")[0],
                           int(n["client_address"].rpartition(":")[2])) for n in groups[0]["nodes"]}
