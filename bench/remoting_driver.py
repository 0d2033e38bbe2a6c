"""The RocketMQ 4.x client's side of ``dledger bench --remoting``: the C++ client's Python wrapper
(``rocketmq-client-python``) in its own environment (``make clients``), driven by
``bench.remoting`` over stdin/stdout. It imports nothing of dledger.

After a warm-up it prints ``{"ready": true}``; on each ``go`` line it runs the next phase and
prints its result: ``sync`` (``--count`` sends one at a time: each latency in ms) then
``concurrent`` (``--count`` sends from ``--concurrency`` threads, each a sync send: the elapsed
seconds and each latency)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

from rocketmq.client import Message, Producer


def _message(topic: str, body: bytes) -> Message:
    m = Message(topic)
    m.set_body(body)
    return m


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=64)
    a = p.parse_args()
    body = os.urandom(a.size // 2).hex().encode()[: a.size]  # text: the wrapper takes a str body
    producer = Producer("bench-remoting", timeout=10_000)
    producer.set_namesrv_addr(a.namesrv)
    producer.start()
    try:
        for _ in range(50):  # warm-up: connections, the route
            producer.send_sync(_message(a.topic, body))
        print(json.dumps({"ready": True}), flush=True)
        sys.stdin.readline()
        lat = []
        t0 = time.perf_counter()
        for _ in range(max(200, a.count // 10)):
            s = time.perf_counter()
            producer.send_sync(_message(a.topic, body))
            lat.append((time.perf_counter() - s) * 1000)
        print(json.dumps({"phase": "sync", "elapsed_s": time.perf_counter() - t0, "lat_ms": lat}),
              flush=True)
        sys.stdin.readline()
        left = [a.count]
        lock = threading.Lock()
        lat2: list[float] = []

        def worker() -> None:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                s = time.perf_counter()
                producer.send_sync(_message(a.topic, body))
                with lock:
                    lat2.append((time.perf_counter() - s) * 1000)

        threads = [threading.Thread(target=worker) for _ in range(a.concurrency)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(json.dumps({"phase": "concurrent", "elapsed_s": time.perf_counter() - t0,
                          "lat_ms": lat2}), flush=True)
    finally:
        producer.shutdown()


if __name__ == "__main__":
    main()
