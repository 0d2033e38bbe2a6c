"""``dledger bench --grpc``: the RocketMQ 5 client (the PyPI ``rocketmq-python-client``) through the
brokers' gRPC endpoint against our own client, in one run on one broker group: a sync send's
p50 (one send at a time) and the throughput of 64 sends in flight. Each system's rows say the
ratio to our client's.

Both clients are driven from this process: ours on an asyncio loop, the RocketMQ client as its
users drive it (``send`` from a thread; ``send_async`` with 64 futures in flight), on its own
threads. A tool, not a test.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

from bench.harness import Row, Servers, broker_group, closed, pct
from client import Message, Producer
from bench.nodeflags import NodeFlags

RMQ = "RocketMQ 5 client"
OURS = "dledger client"
CONCURRENCY = 64


def _endpoints(cluster: Any) -> str:
    return ";".join(f"{h}:{p}" for s in cluster.servers.values() for h, p in [s.ready["grpc"]])


async def _ours(ns: str, servers: Servers, topic: str, body: bytes, n: int) -> list[Row]:
    rows = []
    async with Producer(ns, send_timeout_s=10) as p:
        await p.send(Message(topic, body))
        for name, k, count in (("sync", 1, max(200, n // 10)), ("concurrent", CONCURRENCY, n)):
            cpu0 = servers.cpu_s()
            tput, p50, p99 = await closed(lambda: p.send(Message(topic, body)), count, k)
            rows.append(servers.measured(Row(OURS, "sync", name, len(body), tput, p50, p99), cpu0,
                                         count))
    return rows


def _rocketmq(endpoints: str, servers: Servers, topic: str, body: bytes, n: int) -> list[Row]:
    from rocketmq import ClientConfiguration, Credentials, Message as RmqMessage, Producer as Rmq

    producer = Rmq(ClientConfiguration(endpoints, Credentials()), [topic])
    producer.startup()

    def message() -> Any:
        m = RmqMessage()
        m.topic, m.body = topic, body
        return m

    rows = []
    try:
        for _ in range(50):  # warm-up: channels, routes
            producer.send(message())
        count = max(200, n // 10)
        cpu0 = servers.cpu_s()
        lat = []
        t0 = time.perf_counter()
        for _ in range(count):
            s = time.perf_counter()
            producer.send(message())
            lat.append((time.perf_counter() - s) * 1000)
        elapsed = time.perf_counter() - t0
        rows.append(servers.measured(Row(RMQ, "sync", "sync", len(body), count / elapsed,
                                         pct(lat, 50), pct(lat, 99)), cpu0, count))
        cpu0 = servers.cpu_s()
        slots = threading.Semaphore(CONCURRENCY)
        done = threading.Event()
        lat2: list[float] = []
        lock = threading.Lock()
        left = [n]

        def finished(started: float, _future: Any) -> None:
            with lock:
                lat2.append((time.perf_counter() - started) * 1000)
                left[0] -= 1
                if left[0] == 0:
                    done.set()
            slots.release()

        t0 = time.perf_counter()
        for _ in range(n):
            slots.acquire()
            started = time.perf_counter()
            producer.send_async(message()).add_done_callback(
                lambda f, s=started: finished(s, f))
        done.wait(600)
        elapsed = time.perf_counter() - t0
        rows.append(servers.measured(Row(RMQ, "sync", "concurrent", len(body), len(lat2) / elapsed,
                                         pct(lat2, 50), pct(lat2, 99)), cpu0, n))
    finally:
        producer.shutdown()
    return rows


def run_grpc(size: int, n: int, flags: NodeFlags = NodeFlags()) -> list[Row]:
    """Both clients against one fresh group (sync flush), ``size``-byte messages."""
    body = os.urandom(size)
    with broker_group("sync", flags, extra=("--grpc-listen", "127.0.0.1:0")) as (ns, cluster):
        servers = Servers([s.proc.pid for s in cluster.servers.values() if s.proc is not None])
        ours = asyncio.run(_ours(ns, servers, f"bench-ours-{size}", body, n))
        theirs = _rocketmq(_endpoints(cluster), servers, f"bench-grpc-{size}", body, n)
    by = {r.workload: r for r in ours}
    for r in theirs:
        mine = by[r.workload]
        r.note = (f"{r.msgs_per_s / mine.msgs_per_s:.2f}x our client's msgs/s, "
                  f"p50 {r.p50_ms / mine.p50_ms:.2f}x" if mine.msgs_per_s and mine.p50_ms
                  and r.p50_ms else "")
    return [*ours, *theirs]


__all__ = ["run_grpc"]
