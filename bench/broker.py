"""The broker benchmark (``dledger bench``): a fresh NameServer + 3-node broker group in both flush
modes, and NATS JetStream R3 (three ``nats-server`` processes, a file stream with 3 replicas) side
by side in one run, over the workloads of docs/performance.md: sync, 64 concurrent, batch/pipelined, consume,
64 concurrent over N topics (the growth workload of docs/performance.md; NATS: one stream with N subjects, as
our N topics share one group's log), and (ours) failover (``bench.failover``). Our servers
run with the node options given (``--busy-poll-us``, ``--quorum-first``; by default the node's
defaults), stated in the output. Prints a table with ratios to NATS, the server processes' CPU
seconds per 10,000 messages (warm-up included) and their peak resident memory, saves JSON and, when
matplotlib is installed, a PNG chart. Both systems are driven from this process on Python's
default event loop (our servers run on uvloop). A tool, not a test: figures are only compared
within one run.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any, TypeVar

import click

from bench.failover import measure_failover
from bench.harness import Row, Servers, broker_group, closed, pipelined, warm_up
from bench.nodeflags import NODE_BUSY_POLL_US, NODE_QUORUM_FIRST, NodeFlags, node_flag_options
from client import Message, MessageQueue, Producer, PullConsumer
from dledger.localcluster import LocalCluster, free_ports

F = TypeVar("F", bound=Callable[..., object])

INSTALL_HINT = "apt-get install -y nats-server && pip install nats-py"
BATCH = 64  # messages per send_batch request (one log entry)
# Our fastest publish path: pipelined batches, about as many messages in flight as NATS's
# publish_async allows by default (nats-py's publish_async_max_pending: 4,000); until 2026-12-07
# 16 batches (1,024 messages), which left the servers' cores partly idle.
BATCHES_IN_FLIGHT = 64
PULL_BATCH = 1024  # messages per pull (the broker's maximum)
TOPICS = 64  # the many-topics row: 64 concurrent producers, producer i sending to topic i % TOPICS
DEFAULT_FLAGS = NodeFlags()  # the node's own defaults


# -- ours -----------------------------------------------------------------------------------------------


def topics_workload(topics: int) -> str:
    return f"{topics} topics"


def _topics_note(topics: int, nats: bool) -> str:
    where = f"one stream, {topics} subjects" if nats else f"{topics} topics, one group"
    return f"64 concurrent, producer i on topic i % {topics} ({where})"


async def _ours(ns: str, cluster: LocalCluster, mode: str, size: int, n: int, topics: int) -> list[Row]:
    body = os.urandom(size)
    rows = []
    topic = f"bench-{mode}-{size}"
    servers = Servers([s.proc.pid for s in cluster.servers.values() if s.proc is not None])
    async with Producer(ns, send_timeout_s=10) as p:
        await p.send(Message(topic, body))
        for name, k, count in (("sync", 1, max(200, n // 10)), ("concurrent", 64, n)):
            cpu0 = servers.cpu_s()
            tput, p50, p99 = await closed(lambda: p.send(Message(topic, body)), count, k)
            rows.append(servers.measured(Row("dledger", mode, name, size, tput, p50, p99), cpu0,
                                         count + warm_up(count)))
        batch = [Message(topic, body) for _ in range(BATCH)]
        cpu0 = servers.cpu_s()
        sent, rate = await pipelined(lambda: p.send_batch(batch), BATCH, n, BATCHES_IN_FLIGHT)
        rows.append(servers.measured(Row(
            "dledger", mode, "batch", size, rate,
            note=f"{BATCHES_IN_FLIGHT} batches of {BATCH} in flight"), cpu0, sent))
    async with PullConsumer(ns, "bench") as c:
        queues = await c.fetch_queues(topic)
        cpu0 = servers.cpu_s()
        t0 = time.perf_counter()

        async def drain(mq: MessageQueue) -> int:  # each queue by its own puller, as consumers do
            got, offset = 0, 0
            while True:
                r = await c.pull(mq, offset, PULL_BATCH)
                if not r.messages:
                    return got
                got += len(r.messages)
                offset = r.next_offset

        got = sum(await asyncio.gather(*(drain(mq) for mq in queues)))
        rows.append(servers.measured(Row(
            "dledger", mode, "consume", size, got / (time.perf_counter() - t0),
            note=f"{len(queues)} queues pulled in parallel, {PULL_BATCH} per pull"), cpu0, got))
    if topics:
        rows.append(await _ours_over_topics(ns, servers, mode, topic, body, n, topics))
    gap_ms, note = await measure_failover(ns, cluster, size, topic)
    rows.append(Row("dledger", mode, "failover", size, 0.0, gap_ms, None, note=note))
    return rows


async def _ours_over_topics(ns: str, servers: Servers, mode: str, topic: str, body: bytes,
                            n: int, topics: int) -> Row:
    names = [f"{topic}-t{i}" for i in range(topics)]
    async with Producer(ns, send_timeout_s=10) as p:
        for name in names:  # auto-created here, before the clock starts
            await p.send(Message(name, body))
        calls = [lambda name=name: p.send(Message(name, body)) for name in names]
        cpu0 = servers.cpu_s()
        tput, p50, p99 = await closed(calls[0], n, 64, per_caller=calls)
        return servers.measured(Row("dledger", mode, topics_workload(topics), len(body), tput, p50,
                                    p99, note=_topics_note(topics, nats=False)), cpu0,
                                n + warm_up(n))


def run_ours(mode: str, size: int, n: int, flags: NodeFlags = DEFAULT_FLAGS, topics: int = TOPICS,
             extra: tuple[str, ...] = (), tls: bool = False) -> list[Row]:
    """Our rows in flush mode ``mode`` (``extra``: more broker options, e.g. --acl; its rows
    say "+acl" after the mode; ``tls``: TLS on every listener)."""
    with broker_group(mode, flags, extra=extra, tls=tls) as (ns, cluster):
        rows = asyncio.run(_ours(ns, cluster, mode, size, n, topics))
    if "--acl" in extra:
        rows = [replace(r, mode=f"{r.mode}+acl") for r in rows]
    return rows


# -- NATS JetStream R3 ------------------------------------------------------------------------------


def nats_available() -> str | None:
    if shutil.which("nats-server") is None:
        return f"nats-server not found ({INSTALL_HINT})"
    try:
        import nats  # noqa: F401
    except ImportError:
        return f"nats-py not installed ({INSTALL_HINT})"
    return None


def start_nats(d: str) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    ports = free_ports(6)
    client_ports, route_ports = ports[:3], ports[3:]
    procs, urls = [], []
    for i in range(3):
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for j, p in enumerate(route_ports) if j != i)
        conf = os.path.join(d, f"n{i}.conf")
        with open(conf, "w") as f:
            f.write(f"port: {client_ports[i]}\nhost: 127.0.0.1\nserver_name: n{i}\n"
                    f"jetstream {{ store_dir: \"{d}/js{i}\" }}\n"
                    f"cluster {{ name: bench\n listen: 127.0.0.1:{route_ports[i]}\n routes: [{routes}] }}\n")
        procs.append(subprocess.Popen(["nats-server", "-c", conf], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        urls.append(f"nats://127.0.0.1:{client_ports[i]}")
    return procs, urls


async def nats_stream(urls: list[str], name: str, subject: str,
                      **jetstream: Any) -> tuple[Any, Any]:
    """A connection to the cluster and its JetStream context, once the R3 stream ``name`` (of
    ``subject``.>) exists: (nc, js)."""
    import nats

    async def quiet(err: Exception) -> None:
        return None  # the servers are still starting: nats-py retries by itself

    nc = await nats.connect(servers=urls, connect_timeout=5, error_cb=quiet,
                            max_reconnect_attempts=120, reconnect_time_wait=0.25)
    js = nc.jetstream(**jetstream)
    deadline = time.monotonic() + 60
    while True:  # the JetStream meta leader takes a few seconds to appear
        try:
            await js.add_stream(name=name, subjects=[f"{subject}.>"], num_replicas=3)
            return nc, js
        except Exception:  # any error before the cluster is ready: retry
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def _nats(urls: list[str], servers: Servers, size: int, n: int, topics: int) -> list[Row]:
    from nats.js.api import AckPolicy, ConsumerConfig

    nc, js = await nats_stream(urls, "BENCH", "bench", timeout=10)
    body = os.urandom(size)
    rows = []
    for name, k, count in (("sync", 1, max(200, n // 10)), ("concurrent", 64, n)):
        cpu0 = servers.cpu_s()
        tput, p50, p99 = await closed(lambda: js.publish("bench.x", body), count, k)
        rows.append(servers.measured(Row("NATS JetStream R3", "-", name, size, tput, p50, p99),
                                     cpu0, count + warm_up(count)))
    cpu0 = servers.cpu_s()
    t0 = time.perf_counter()
    for _ in range(n):
        await js.publish_async("bench.x", body)
    await js.publish_async_completed()
    rows.append(servers.measured(Row("NATS JetStream R3", "-", "batch", size,
                                     n / (time.perf_counter() - t0), note="publish_async"), cpu0, n))
    total = (await js.stream_info("BENCH")).state.messages
    sub = await js.pull_subscribe("bench.x", "bench", config=ConsumerConfig(ack_policy=AckPolicy.NONE))
    cpu0 = servers.cpu_s()
    t0 = time.perf_counter()
    got = 0
    while got < total:
        msgs = await sub.fetch(batch=256, timeout=5)
        got += len(msgs)
    rows.append(servers.measured(Row("NATS JetStream R3", "-", "consume", size,
                                     got / (time.perf_counter() - t0)), cpu0, got))
    if topics:  # after the consume row, which drains bench.x alone and counts the whole stream
        calls = [lambda i=i: js.publish(f"bench.t{i}", body) for i in range(topics)]
        cpu0 = servers.cpu_s()
        tput, p50, p99 = await closed(calls[0], n, 64, per_caller=calls)
        rows.append(servers.measured(Row("NATS JetStream R3", "-", topics_workload(topics), size,
                                         tput, p50, p99, note=_topics_note(topics, nats=True)),
                                     cpu0, n + warm_up(n)))
    await nc.close()
    return rows


def run_nats(size: int, n: int, topics: int = TOPICS) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="nats-bench-") as d:
        procs, urls = start_nats(d)
        try:
            return asyncio.run(_nats(urls, Servers([p.pid for p in procs]), size, n, topics))
        finally:
            for p in procs:
                p.kill()
                p.wait(timeout=10)


# -- report ---------------------------------------------------------------------------------------


def render(rows: list[Row]) -> str:
    peer = {(r.workload, r.payload_bytes): r for r in rows if r.system.startswith("NATS")}
    head = (f"{'workload':<11} {'payload':>7} {'system':<18} {'mode':<6} {'msgs/s':>9} {'p50 ms':>8} "
            f"{'p99 ms':>8} {'x NATS':>7} {'cpu s/10k':>9} {'peak MiB':>8}  note")
    out = [head, "-" * len(head)]

    def f(v: float | None) -> str:
        return f"{v:.2f}" if v is not None else "-"

    for r in rows:
        p = peer.get((r.workload, r.payload_bytes))
        ratio = f"{r.msgs_per_s / p.msgs_per_s:.2f}" \
            if p and p is not r and p.msgs_per_s and r.msgs_per_s else ""
        out.append(f"{r.workload:<11} {r.payload_bytes:>7} {r.system:<18} {r.mode:<6} "
                   f"{r.msgs_per_s:>9.0f} {f(r.p50_ms):>8} {f(r.p99_ms):>8} {ratio:>7} "
                   f"{f(r.cpu_s_per_10k):>9} {f(r.peak_rss_mib):>8}  {r.note}")
    return "\n".join(out)


def chart(rows: list[Row], path: str) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no chart (pip install matplotlib)"
    tput = [r for r in rows if r.msgs_per_s and r.workload != "failover"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 1.5 + 0.32 * len(tput)))
    labels = [f"{r.workload} · {r.system.split()[0]} {r.mode} · {r.payload_bytes} B" for r in tput]
    a.barh(labels, [r.msgs_per_s for r in tput])
    a.set_xlabel("messages/s (higher is better)")
    lat = [r for r in rows if r.p50_ms is not None and r.workload in ("sync", "concurrent")]
    b.barh([f"{r.workload} {r.system.split()[0]} {r.mode} {r.payload_bytes}B" for r in lat],
           [r.p50_ms for r in lat])
    b.set_xlabel("p50 latency, ms (lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None


def options(f: F) -> F:
    """The options of ``dledger bench`` (applied in cli.py, which stays a thin call into main)."""
    f = node_flag_options(NODE_BUSY_POLL_US, NODE_QUORUM_FIRST)(f)  # the node's defaults
    f = click.option("--topics", type=click.IntRange(0, 64), default=TOPICS, show_default=True,
                     help="The many-topics row: 64 concurrent producers over this many topics "
                          "(NATS: one stream, this many subjects); 0 leaves the row out.")(f)
    f = click.option("--out", "out_dir", default="bench-results", show_default=True,
                     type=click.Path(file_okay=False), help="Where the JSON and the PNG chart go.")(f)
    f = click.option("--payloads", default="128,1024", show_default=True)(f)
    f = click.option("--acl", is_flag=True,
                     help="Our rows with access control on: brokers started with --acl, every "
                          "request signed by an admin account (the cost of signing and "
                          "checking); NATS left out.")(f)
    f = click.option("--tls", is_flag=True, help="Our cluster with TLS on every listener and "
                                                  "mutual TLS between peers (docs/tls.md).")(f)
    f = click.option("--grpc", is_flag=True,
                     help="Only the RocketMQ 5 client through the gRPC endpoint against our own "
                          "client (sync p50, 64 in flight), one group, sync flush.")(f)
    f = click.option("--remoting", is_flag=True,
                     help="Only the RocketMQ 4.x C++ client through the remoting endpoint against "
                          "our own client (sync p50, 64 in flight), one group, sync flush; the "
                          "client's environment comes from `make clients`.")(f)
    return click.option("--quick", is_flag=True, help="A short run (2,000 messages per workload).")(f)


def main(quick: bool, payloads: str, out_dir: str, topics: int = TOPICS, busy_poll_us: int = 0,
         quorum_first: bool = False, grpc: bool = False, acl: bool = False,
         tls: bool = False, remoting: bool = False) -> int:
    sizes = [int(p) for p in payloads.split(",") if p]
    extra: tuple[str, ...] = ()
    if acl:  # an admin account the brokers know from the start; the client signs as it
        secret = os.urandom(16).hex()
        os.environ.update({"DLEDGER_ACL_SECRET_BENCH": secret, "DLEDGER_ACCESS_KEY": "bench",
                           "DLEDGER_SECRET_KEY": secret})
        extra = ("--acl", "--acl-admin-key", "bench")
    flags = NodeFlags(busy_poll_us, quorum_first)
    n = 2000 if quick else 20_000
    plan: list[tuple[str, Any]] = []
    for size in sizes:
        plan += [("grpc", size)] if grpc else [("remoting", size)] if remoting \
            else [("nats", size), ("sync", size), ("async", size)]
    missing = None if grpc or remoting else "left out with --acl" if acl else nats_available()
    rows: list[Row] = []
    click.echo(f"dledger bench: {flags.describe()}{', TLS' if tls else ''}", err=True)
    with click.progressbar(plan, label="dledger bench", file=sys.stderr,
                           item_show_func=lambda s: f"{s[0]} {s[1]} B" if s else "") as bar:
        for what, size in bar:
            if what == "grpc":
                from bench.grpc import run_grpc
                rows += run_grpc(size, n // 4, flags)
            elif what == "remoting":
                from bench.remoting import run_remoting
                rows += run_remoting(size, n // 4, flags)
            elif what == "nats":
                if missing:
                    continue
                rows += run_nats(size, n, topics)
            else:
                rows += run_ours(what, size, n, flags, topics, extra, tls)
    os.makedirs(out_dir, exist_ok=True)
    print(f"dledger servers' {flags.describe()}")
    print(render(rows))
    if missing:
        print(f"\nNATS JetStream skipped: {missing}")
    with open(os.path.join(out_dir, "broker-bench.json"), "w") as f:
        json.dump({"rows": [asdict(r) for r in rows], "cores": os.cpu_count(),
                   "node_options": asdict(flags), "node_args": list(flags.args()),
                   "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, f, indent=2)
    note = chart(rows, os.path.join(out_dir, "broker-bench.png"))
    print(note or f"\nsaved {out_dir}/broker-bench.json and broker-bench.png")
    return 0
