"""``python -m bench.hops.rounds [--topics T] [--callers C] [--producers P] [--seconds S]
[--mode sync|async] [--payload BYTES] [--batch N] [--busy-poll-us US]``: C closed-loop callers
over T topics (caller i on topic i % T; ``dledger bench``'s "64 topics" row is 64 over 64, its
"concurrent" row 64 over 1, its fastest path 64 over 1 with ``--batch 64``: each call a
``send_batch`` of N messages), sharing P producers, against a fresh NameServer and 3-node group
(``bench.harness.broker_group``); after a 2 s warm-up, S seconds measured. Prints the rate, how
the sends travelled (log entries and client requests, from the leader's ``/metrics``, and
messages per each), and each process's CPU per message (the leader, the followers, the client).

Where ``bench.hops`` follows a round's steps, this says what a round costs each process, without
stamps: the number to compare when a change is to make a row cheaper. A tool, not a test."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import urllib.request
from dataclasses import dataclass

from bench.load import processes_cpu_s

WARM_UP_S = 2.0
# (the leader's counters, summed over their label sets)
ENTRIES = "dledger_commit_latency_seconds_count"
REQUESTS = "dledger_send_latency_seconds_count"
MESSAGES = "dledger_messages_in_total"


@dataclass(frozen=True)
class Counts:
    entries: float
    requests: float
    messages: float


def scrape(admin: tuple[str, int]) -> Counts:
    """A node's send counters from its ``/metrics``."""
    host, port = admin
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
        return counts(resp.read().decode())


def counts(text: str) -> Counts:
    """The send counters of a metrics page (Prometheus' text format)."""
    totals = {ENTRIES: 0.0, REQUESTS: 0.0, MESSAGES: 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return Counts(totals[ENTRIES], totals[REQUESTS], totals[MESSAGES])


async def _run(ns: str, admins: dict[str, tuple[str, int]], pids: dict[str, int],
               args: argparse.Namespace) -> str:
    from client import Message, Producer
    body = os.urandom(args.payload)
    names = [f"rounds-{i}" for i in range(args.topics)]
    producers = [Producer(ns, send_timeout_s=10) for _ in range(args.producers)]
    for p in producers:
        await p.start()
    try:
        for name in names:  # (created before the clock starts)
            await producers[0].send(Message(name, body))

        async def caller(i: int, until: float) -> int:
            p, message, sent = producers[i % len(producers)], Message(names[i % len(names)], body), 0
            batch = [Message(names[i % len(names)], body) for _ in range(args.batch)]
            while time.monotonic() < until:
                if args.batch > 1:
                    await p.send_batch(batch)
                else:
                    await p.send(message)
                sent += args.batch
            return sent

        await asyncio.gather(*(caller(i, time.monotonic() + WARM_UP_S) for i in range(args.callers)))
        before = {nid: scrape(a) for nid, a in admins.items()}
        cpu0 = {nid: processes_cpu_s([pid]) for nid, pid in pids.items()}
        client0, t0 = time.process_time(), time.monotonic()
        sent = sum(await asyncio.gather(*(caller(i, t0 + args.seconds)
                                          for i in range(args.callers))))
        elapsed_s, client_s = time.monotonic() - t0, time.process_time() - client0
        cpu = {nid: processes_cpu_s([pid]) - cpu0[nid] for nid, pid in pids.items()}
        after = {nid: scrape(a) for nid, a in admins.items()}
    finally:
        for p in producers:
            await p.close()
    leader = max(after, key=lambda nid: after[nid].entries - before[nid].entries)
    entries = after[leader].entries - before[leader].entries
    requests = after[leader].requests - before[leader].requests
    stored = after[leader].messages - before[leader].messages

    def us(seconds: float) -> str:
        return f"{seconds / sent * 1e6:.1f}" if sent else "-"

    followers = " ".join(f"{nid} {us(cpu[nid])}" for nid in sorted(cpu) if nid != leader)
    return (f"{sent} messages of {args.payload} B from {args.callers} callers over {args.topics} "
            f"topics{f' in batches of {args.batch}' if args.batch > 1 else ''}, "
            f"{args.producers} producer(s), {args.mode} flush: "
            f"{sent / elapsed_s:.0f} msg/s\n"
            f"  {entries:.0f} entries, {requests:.0f} requests: "
            f"{stored / entries if entries else 0:.1f} messages an entry, "
            f"{stored / requests if requests else 0:.1f} a request\n"
            f"  CPU us a message: leader {leader} {us(cpu[leader])}, followers {followers}, "
            f"servers {us(sum(cpu.values()))}, client {us(client_s)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.hops.rounds", description=__doc__)
    ap.add_argument("--topics", type=int, default=64)
    ap.add_argument("--callers", type=int, default=64)
    ap.add_argument("--producers", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--mode", choices=("sync", "async"), default="sync")
    ap.add_argument("--payload", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1,
                    help="messages a call: 1 sends each alone, more a send_batch of that many")
    ap.add_argument("--busy-poll-us", type=int, default=None,
                    help="the nodes' --busy-poll-us (default: the node's default)")
    args = ap.parse_args(argv)
    if not (1 <= args.topics <= 1024 and 1 <= args.callers <= 1024
            and 1 <= args.producers <= args.callers and 0.1 <= args.seconds <= 600
            and 1 <= args.payload <= 4 << 20 and 1 <= args.batch <= 1024):
        ap.error("--topics and --callers must be 1..1024, --producers 1..--callers, "
                 "--seconds 0.1..600, --payload 1..4194304 and --batch 1..1024")
    from bench.harness import broker_group
    from bench.nodeflags import NodeFlags
    flags = NodeFlags() if args.busy_poll_us is None else NodeFlags(busy_poll_us=args.busy_poll_us)
    with broker_group(args.mode, flags) as (ns, cluster):
        admins = {nid: (str(s.ready["admin"][0]), int(s.ready["admin"][1]))
                  for nid, s in cluster.servers.items()}
        pids = {nid: s.proc.pid for nid, s in cluster.servers.items() if s.proc is not None}
        print(asyncio.run(_run(ns, admins, pids, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
