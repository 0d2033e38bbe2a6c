"""``python -m bench.hops [--sends N] [--topics T] [--mode sync|async] [--payload BYTES]
[--busy-poll-us US]``: a fresh NameServer and 3-node group (``bench.harness.broker_group``, as
``dledger bench`` starts them), one producer on the standard asyncio loop (as the bench's
client), every process's frames stamped (``bench.hops.record``); prints each step's median
(``bench.hops.timeline``) and the client's CPU per message. By default the producer sends one
message at a time (the p50 is printed); with ``--topics T``, T closed-loop callers share it, each
on a topic of its own (``dledger bench``'s "64 topics" row with 64), and the steps are those of
the rounds their requests go in (the rate is printed)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.hops.record import HOPS_DIR_ENV, flush_now, install
from bench.hops.timeline import (
    CLIENT,
    ROUND_STEPS,
    STEPS,
    Stamp,
    Timeline,
    median_rounds,
    median_steps,
)

SITE = Path(__file__).resolve().parent / "site"
WARM_UP_SENDS = 300


def _stamps(out_dir: str, names: dict[int, str]) -> list[Stamp]:
    stamps = []
    for path in Path(out_dir).glob("*.jsonl"):
        process = names.get(int(path.stem))
        if process is None:
            continue  # (the NameServer's)
        for line in path.read_text(encoding="utf-8").splitlines():
            ns, event, _, head = json.loads(line)
            stamps.append(Stamp(ns, process, event, head))
    return stamps


async def _sends(ns: str, count: int, payload: int) -> tuple[list[tuple[int, int]], float]:
    from client import Message, Producer
    body = os.urandom(payload)
    async with Producer(ns, send_timeout_s=10) as p:
        for _ in range(WARM_UP_SENDS):
            await p.send(Message("hops", body))
        marks = []
        cpu0 = time.process_time()
        for _ in range(count):
            t0 = time.perf_counter_ns()
            await p.send(Message("hops", body))
            marks.append((t0, time.perf_counter_ns()))
        return marks, (time.process_time() - cpu0) / count * 1e6


async def _rounds(ns: str, count: int, payload: int, topics: int) -> tuple[float, float]:
    """``count`` messages from ``topics`` closed-loop callers, each on its own topic: the rate
    and the client's CPU per message."""
    from client import Message, Producer
    body = os.urandom(payload)
    names = [f"hops-{i}" for i in range(topics)]
    async with Producer(ns, send_timeout_s=10) as p:
        for name in names:  # (created before the clock starts)
            for _ in range(max(1, WARM_UP_SENDS // topics)):
                await p.send(Message(name, body))

        async def caller(name: str) -> None:
            for _ in range(count // topics):
                await p.send(Message(name, body))
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(caller(name) for name in names))
        sent = count // topics * topics
        return sent / (time.perf_counter() - t0), (time.process_time() - cpu0) / sent * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.hops", description=__doc__)
    ap.add_argument("--sends", type=int, default=1000, help="messages sent (default 1000)")
    ap.add_argument("--topics", type=int, default=0,
                    help="closed-loop callers, each on a topic of its own (default 0: one "
                         "message at a time)")
    ap.add_argument("--mode", choices=("sync", "async"), default="sync")
    ap.add_argument("--payload", type=int, default=128)
    ap.add_argument("--busy-poll-us", type=int, default=None,
                    help="the nodes' --busy-poll-us (default: the node's default)")
    args = ap.parse_args(argv)
    if not 1 <= args.sends <= 1_000_000 or not 1 <= args.payload <= 4 << 20 \
            or not 0 <= args.topics <= 1024 or args.sends < args.topics:
        ap.error("--sends must be 1..1000000 (at least --topics), --topics 0..1024 and "
                 "--payload 1..4194304")
    with tempfile.TemporaryDirectory(prefix="dledger-hops-") as out_dir:
        os.environ[HOPS_DIR_ENV] = out_dir  # (read by the servers started below)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(SITE), os.environ.get("PYTHONPATH", "")) if p)
        install(out_dir)
        from bench.harness import broker_group
        from bench.nodeflags import NodeFlags
        flags = NodeFlags() if args.busy_poll_us is None else NodeFlags(busy_poll_us=args.busy_poll_us)
        marks: list[tuple[int, int]] = []
        with broker_group(args.mode, flags) as (ns, cluster):
            names = {s.proc.pid: node for node, s in cluster.servers.items() if s.proc is not None}
            if args.topics:
                rate, cpu_us = asyncio.run(_rounds(ns, args.sends, args.payload, args.topics))
            else:
                marks, cpu_us = asyncio.run(_sends(ns, args.sends, args.payload))
        names[os.getpid()] = CLIENT
        flush_now()
        timeline = Timeline(_stamps(out_dir, names))
        if args.topics:
            steps, followed = median_rounds(timeline)
        else:
            steps, followed = median_steps(timeline, marks)
    if args.topics:
        print(f"{args.sends} messages of {args.payload} B from {args.topics} callers on as many "
              f"topics, {args.mode} flush: {rate:.0f} msg/s; the client's CPU {cpu_us:.1f} us a "
              f"message; {followed} rounds followed hop by hop")
    else:
        lat_ms = statistics.median((t1 - t0) / 1e6 for t0, t1 in marks)
        print(f"{args.sends} lone sends of {args.payload} B, {args.mode} flush: p50 {lat_ms:.3f} "
              f"ms; the client's CPU {cpu_us:.0f} us a send; {followed} sends followed hop by hop")
    if not followed:
        print("nothing could be followed (see bench/hops/timeline.py)", file=sys.stderr)
        return 1
    for (name, _), us in zip(ROUND_STEPS if args.topics else STEPS, steps):
        print(f"  {us:7.0f} us  {name}")
    print(f"  {sum(steps):7.0f} us  in all (the sum of the medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
