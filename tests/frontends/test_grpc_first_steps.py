"""What a user of the official RocketMQ 5 client meets first (issue 34 items 21, 22), against the
brokers' gRPC endpoint (tests/frontends/conftest.py): the documentation's example
(docs/features.md, "RocketMQ 5 clients") runs as written, prints what it sent and received, and
exits; a message sent delayed to a topic that did not exist makes the topic exist at once, so a
consumer started while it waits finds the topic (it got TopicNotFoundError until the message was
due) and receives the message when it is due."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from client import PullConsumer
from tests.frontends.grpc_helpers import (
    receive_until,
    rmq_producer,
    send_delayed,
    simple_consumer,
)

pytestmark = pytest.mark.slow

FEATURES_MD = Path(__file__).resolve().parents[2] / "docs" / "features.md"
DOCS_ENDPOINTS = "127.0.0.1:8081;127.0.0.1:8082;127.0.0.1:8083"
EXAMPLE_TIMEOUT_S = 60.0


def docs_example() -> str:
    """The first Python block of features.md's RocketMQ 5 section."""
    text = FEATURES_MD.read_text(encoding="utf-8")
    section = text[text.index("## RocketMQ 5 clients"):]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None, "no python example in the RocketMQ 5 section"
    return found.group(1)


def test_the_docs_example_prints_what_it_received_and_exits(cluster: tuple[str, str],
                                                            tmp_path: Path) -> None:
    _, endpoints = cluster
    code = docs_example()
    assert DOCS_ENDPOINTS in code
    # both clients closed (the process also ends without it, their threads being daemons, but
    # a program that goes on would keep them running)
    assert "consumer.shutdown()" in code and "producer.shutdown()" in code
    script = tmp_path / "example.py"
    script.write_text(code.replace(DOCS_ENDPOINTS, endpoints), encoding="utf-8")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            cwd=tmp_path)
    try:
        out, err = proc.communicate(timeout=EXAMPLE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()  # (by its PID) the example did not exit: its clients were left running
        out, err = proc.communicate(timeout=10)
        raise AssertionError(f"the example did not exit within {EXAMPLE_TIMEOUT_S:g} s: "
                             f"{out}\n{err}") from None
    assert proc.returncode == 0, err
    sent = re.search(r"^sent (\S+)$", out, re.M)
    assert sent is not None, out
    assert f"received hello TagA {sent.group(1)}" in out.splitlines(), out


def test_a_delayed_messages_topic_exists_from_the_send_on(cluster: tuple[str, str]) -> None:
    ns, endpoints = cluster
    producer = rmq_producer(endpoints, ["fresh-delay"])
    try:
        due_ms = send_delayed(producer, "fresh-delay", b"in twelve seconds", 12_000)
    finally:
        producer.shutdown()

    async def while_it_waits() -> list[int]:
        """The topic's queues' message counts, read as soon as the route shows the topic
        (``fetch_queues`` raised TopicNotFoundError after its 5 s until the message was due)."""
        async with PullConsumer(ns, "early-reader", timeout_s=5) as c:
            queues = await c.fetch_queues("fresh-delay")
            return [(await c.pull(mq, 0, 0)).max_offset for mq in queues]
    held = asyncio.run(while_it_waits())
    assert held and set(held) == {0}, held  # the topic is there, the message not yet

    consumer = simple_consumer(endpoints, "early-group", "fresh-delay")
    try:
        got = receive_until(consumer, 1, invisible_s=10, timeout_s=40)
        assert time.time() * 1000 >= due_ms, "received before its delivery time"
        assert [x.body for x in got] == [b"in twelve seconds"]
        consumer.ack(got[0])
    finally:
        consumer.shutdown()
