"""``dledger bench --grpc``: the RocketMQ 5 client (the PyPI ``rocketmq-python-client``) through the
brokers' gRPC endpoint against our own client, in one run on one broker group: a sync send's
p50 (one send at a time) and the throughput of 64 sends in flight. Each system's rows say the
ratio to our client's. The RocketMQ client sends to one node of the group (the address that
sorts first), which the run makes the leader (served in process) and then a follower (which
forwards to the leader), a pair of rows each. The same client's workload against a gRPC server
that stores nothing (``bench.grpc_noop``) gives its ceiling: the gateway's rows say their
share of it too.

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

from bench.grpc_noop import NoopServer
from bench.harness import Row, Servers, broker_group, closed, pct
from bench.nodeflags import NodeFlags
from chaos.live.grpc_clients import started as started_in_this_thread
from client import Message, Producer
from dledger.client import LogClient
from protocol.broker_kinds import BROKER_STATUS, TRANSFER_LEADERSHIP
from protocol.errors import DLedgerError

DEFAULT_FLAGS = NodeFlags()  # the node's own defaults
RMQ_LEADER = "RocketMQ5 leader"  # the official client, its endpoint the group's leader's
RMQ_FOLLOWER = "RocketMQ5 follower"  # ... a follower's (which forwards to the leader)
NOOP = "RocketMQ5 no-op"  # the same client against a server that stores nothing
OURS = "dledger client"
CONCURRENCY = 64


def _endpoints(cluster: Any) -> str:
    return ";".join(f"{h}:{p}" for s in cluster.servers.values() for h, p in [s.ready["grpc"]])


def _pinned(cluster: Any) -> str:
    """The node the official client sends to: it sorts an ``Endpoints``' addresses as
    ``host:port`` text and its channel takes the first (rocketmq-python-client 5.1)."""
    def address(nid: str) -> str:
        host, port = cluster.servers[nid].ready["grpc"]
        return f"{host}:{port}"
    return str(min(cluster.servers, key=address))


async def _leadership(cluster: Any, node: str, lead: bool, timeout_s: float = 30.0) -> None:
    """Make ``node`` the group's leader (``lead``) or a follower, by a leadership transfer."""
    deadline = time.monotonic() + timeout_s
    async with LogClient(cluster.client_addresses, timeout_s=5) as client:
        while True:
            roles = {}
            for n in cluster.client_addresses:
                try:
                    roles[n] = (await client.call(n, BROKER_STATUS))["raft"]["role"]
                except DLedgerError:
                    roles[n] = "?"
            leader = next((n for n, r in roles.items() if r == "leader"), None)
            if leader is not None and (leader == node) == lead:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not make {node} {'lead' if lead else 'follow'}: {roles}")
            if leader is not None:
                target = node if lead else next(n for n in sorted(roles) if n != node)
                try:
                    await client.call(leader, TRANSFER_LEADERSHIP, target)
                except DLedgerError:
                    pass  # (under way, or leadership moved meanwhile: looked at again)
            await asyncio.sleep(0.2)  # until the transfer shows in the nodes' status


async def our_rows(ns: str, servers: Servers, topic: str, body: bytes, n: int) -> list[Row]:
    rows = []
    async with Producer(ns, send_timeout_s=10) as p:
        await p.send(Message(topic, body))
        for name, k, count in (("sync", 1, max(200, n // 10)), ("concurrent", CONCURRENCY, n)):
            cpu0 = servers.cpu_s()
            tput, p50, p99 = await closed(lambda: p.send(Message(topic, body)), count, k)
            rows.append(servers.measured(Row(OURS, "sync", name, len(body), tput, p50, p99), cpu0,
                                         count))
    return rows


def rocketmq_rows(endpoints: str, servers: Servers, topic: str, body: bytes, n: int,
              system: str) -> list[Row]:
    from rocketmq import ClientConfiguration, Credentials
    from rocketmq import Message as RmqMessage
    from rocketmq import Producer as Rmq

    # (started with the library's own loop current in this thread: after an asyncio.run here,
    # a route answered before its callback was added fails otherwise: ``started``)
    producer = started_in_this_thread(Rmq(ClientConfiguration(endpoints, Credentials()), [topic]))

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
        rows.append(servers.measured(Row(system, "sync", "sync", len(body), count / elapsed,
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
        rows.append(servers.measured(Row(system, "sync", "concurrent", len(body), len(lat2) / elapsed,
                                         pct(lat2, 50), pct(lat2, 99)), cpu0, n))
    finally:
        producer.shutdown()
    return rows


async def _gateways(cluster: Any) -> dict[str, dict[str, Any]]:
    """Each node's gRPC endpoint counts and whether it leads (its status)."""
    out = {}
    async with LogClient(cluster.client_addresses, timeout_s=5) as client:
        for node in cluster.client_addresses:
            st = await client.call(node, BROKER_STATUS)
            out[node] = {**st.get("grpc", {}), "leader": st["raft"]["role"] == "leader"}
    return out


def _where(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> str:
    """Which endpoint served the official client's sends: the leader's (in process) or a
    follower's (forwarding each to the leader)."""
    out = []
    for node, st in after.items():
        def grew(key: str, st: dict[str, Any] = st, node: str = node) -> int:
            return int(st.get(key, 0) - before[node].get(key, 0))
        if grew("own_group_calls") > 0:
            out.append(f"{node} ({'leader' if st['leader'] else 'follower'}): "
                       f"{grew('own_group_calls')} calls in {grew('send_requests')} requests, "
                       f"{grew('forwarded')} forwarded")
    return "; ".join(out)


def run_grpc(size: int, n: int, flags: NodeFlags = DEFAULT_FLAGS) -> list[Row]:
    """Both clients against one fresh group (sync flush), ``size``-byte messages."""
    body = os.urandom(size)
    with broker_group("sync", flags, extra=("--grpc-listen", "127.0.0.1:0")) as (ns, cluster):
        servers = Servers([s.proc.pid for s in cluster.servers.values() if s.proc is not None])
        ours = asyncio.run(our_rows(ns, servers, f"bench-ours-{size}", body, n))
        theirs = []
        for system, lead in ((RMQ_LEADER, True), (RMQ_FOLLOWER, False)):
            asyncio.run(_leadership(cluster, _pinned(cluster), lead))
            counts = asyncio.run(_gateways(cluster))
            rows = rocketmq_rows(_endpoints(cluster), servers, f"bench-grpc-{size}-{lead}", body, n,
                             system)
            rows[-1].note = f" [served by {_where(counts, asyncio.run(_gateways(cluster)))}]"
            theirs += rows
    with NoopServer() as noop:
        ceiling = rocketmq_rows(noop.address, Servers([noop.pid]), f"bench-noop-{size}", body, n,
                            NOOP)
    by = {r.workload: r for r in ours}
    top = {r.workload: r for r in ceiling}
    for r in [*theirs, *ceiling]:
        mine = by[r.workload]
        served = r.note
        r.note = (f"{r.msgs_per_s / mine.msgs_per_s:.2f}x our client's msgs/s, "
                  f"p50 {r.p50_ms / mine.p50_ms:.2f}x" if mine.msgs_per_s and mine.p50_ms
                  and r.p50_ms else "")
        if r.system != NOOP and top[r.workload].msgs_per_s:
            r.note += f", {r.msgs_per_s / top[r.workload].msgs_per_s:.0%} of the no-op's"
        if mine.cpu_s_per_10k and r.cpu_s_per_10k:
            r.note += f", CPU {r.cpu_s_per_10k / mine.cpu_s_per_10k:.1f}x"
        r.note += served
    return [*ours, *theirs, *ceiling]


__all__ = ["our_rows", "rocketmq_rows", "run_grpc"]
