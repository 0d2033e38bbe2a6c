"""What the examples share, so that each example's file shows only its RocketMQ part: the
command line (``--namesrv``, ``--topic``, ``--group``, ``--count``, ``--timeout-s``), one printed
line per message or send result (the Java examples' ``System.out.println``), and a consumer's
run until it has received what it expects or its time is up.

Not part of the client library: an example imports it as ``support`` (Python puts the script's
own folder first on ``sys.path``). It must not hide anything a user of the library needs to see.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import sys
import time
from collections.abc import Coroutine
from typing import Any

from client import PushConsumer, ReceivedMessage, SendResult

# As every dledger command: $NAMESRV_ADDR, else where `dledger up` starts its NameServer.
NAMESRV_DEFAULT = os.environ.get("NAMESRV_ADDR") or "127.0.0.1:9876"


def arguments(doc: str | None, *, topic: str, count: int, group: str | None = None,
              timeout_s: float = 60.0, count_help: str = "") -> argparse.ArgumentParser:
    """The options every example takes; a consumer (``group`` given) also ``--group`` and
    ``--timeout-s``. Prints are line-buffered, so that each line shows (or reaches a pipe) at
    once."""
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    p = argparse.ArgumentParser(description=(doc or "").strip().split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--namesrv", default=NAMESRV_DEFAULT,
                   help="NameServer address(es), host:port separated by ';' ($NAMESRV_ADDR if set)")
    p.add_argument("--topic", default=topic, help="the topic")
    p.add_argument("--count", type=_positive, default=count,
                   help=count_help or ("messages to send" if group is None else
                                       "messages to wait for"))
    if group is not None:
        p.add_argument("--group", default=group, help="the consumer group")
        p.add_argument("--timeout-s", type=float, default=timeout_s,
                       help="give up (exit 1) after this long")
    return p


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"a positive number, not {text}")
    return n


def clock() -> str:
    """The wall time as the Java examples print it (``mm:ss``), with milliseconds."""
    now = time.time()
    return time.strftime("%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"


def sent(r: SendResult) -> str:
    """One send result (Java's ``SendResult [sendStatus=..., msgId=..., messageQueue=...]``)."""
    return (f"{r.status} topic={r.queue.topic} queue={r.queue.group}/{r.queue.queue_id} "
            f"queue_offset={r.queue_offset} msg_id={r.msg_id} offset_msg_id={r.offset_msg_id}")


def line(m: ReceivedMessage) -> str:
    """One received message (Java's ``MessageExt [...]``); the body last."""
    props = f" props={dict(m.properties)}" if m.properties else ""
    return (f"topic={m.topic} queue={m.queue.group}/{m.queue.queue_id} "
            f"queue_offset={m.queue_offset} tags={m.tags!r} keys={list(m.keys)} "
            f"reconsume_times={m.reconsume_times} msg_id={m.msg_id}{props} "
            f"body={m.body.decode(errors='replace')!r}")


class Expect:
    """What a consumer waits for: ``count`` messages (or orders, or successes), and no failure.
    A listener calls ``got()`` for each and ``fail()`` for anything it did not expect."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.received = 0
        self.failures: list[str] = []
        self.done = asyncio.Event()  # (binds no loop until it is waited on)

    def got(self, n: int = 1) -> None:
        self.received += n
        if self.received >= self.count:
            self.done.set()

    def fail(self, why: str) -> None:
        print(f"UNEXPECTED: {why}")
        self.failures.append(why)


async def consume(consumer: PushConsumer, expect: Expect, timeout_s: float) -> int:
    """Start ``consumer``, wait until ``expect`` is met or ``timeout_s`` has passed, then close
    it (which commits its progress). The exit code: 0 only when every expected message came and
    nothing unexpected did."""
    try:
        async with asyncio.timeout(timeout_s):
            await consumer.start()
            print("Consumer Started")
            await expect.done.wait()
    except TimeoutError:
        print(f"timed out after {timeout_s} s: received {expect.received} of {expect.count}",
              file=sys.stderr)
        return 1
    finally:
        await consumer.close()
    if expect.failures:
        print(f"{len(expect.failures)} unexpected: {expect.failures[0]}", file=sys.stderr)
        return 1
    return 0


def run(main: Coroutine[Any, Any, int]) -> None:
    """``sys.exit(asyncio.run(main))``: the coroutine's result is the exit code."""
    sys.exit(asyncio.run(main))
