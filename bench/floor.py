"""``python -m bench.floor [--payloads 128,1024] [--messages N] [--flush sync|async] [--no-nats]
[--ours]``: the floor under issue 37's rows. A replicated send reduced to what no Python broker
with our guarantees can leave out, run as three server processes on uvloop beside NATS JetStream
R3 (and, with ``--ours``, our broker) in the same run, with the same client-side harness
(``bench.harness.closed``) and the same three workloads as ``dledger bench``: one producer one
send at a time, 64 producers over 64 topics, and the fastest path (64 pipelined batches of 64).
What it says: a row the floor meets by far is within reach of a Python broker, and the broker's
own work is what keeps it short; a row the floor only just meets, or misses in some runs, leaves
a broker little or no room. It is not a strict lower bound (its fsync blocks its loop; nothing
in it is tuned), so it cannot show a row to be out of reach.

What the floor does for a send, and nothing more:
- the client encodes its messages as a CBOR list of ``[topic, body]`` in one length-prefixed
  frame: the sends made in one loop turn in one frame, as our producer gathers them, and a batch
  in a frame of its own, as our producer's ``send_batch`` sends it;
- the leader sends the frames of each read, each prefixed with its log index, to both followers,
  writes them to one log file and fdatasyncs it once (``--flush sync``; ``async``: no fsync at
  all), then answers once one follower has written and fdatasynced them too: a majority of
  three. A follower acknowledges the frames of each read in one answer. Answers leave in log
  order;
- every replica applies each entry: decodes the list and gives each message the next offset of
  its topic's queue; the answer is the CBOR list of the offsets.

Left out, and in the broker: terms, elections and their state, checksums, the log's index file
and its recovery, queues, keys and their indexes, dedup, properties, validation of every field,
access control, metrics, retention, checkpoints, routes. A server that loses its leader or a
follower exits (the leader's exit fails the client's sends). A tool, not a test."""

from __future__ import annotations

import asyncio
import collections
import os
import select
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import cbor2
import click

from bench.broker import BATCH, BATCHES_IN_FLIGHT, TOPICS, nats_available, run_nats, run_ours
from bench.harness import Row, Servers, closed, pipelined, warm_up

FLOOR = "floor (Python)"
NATS = "NATS JetStream R3"  # (bench.broker's rows' names)
OURS = "dledger"
FRAME = struct.Struct(">I")  # a frame's body length, before the body
INDEX = struct.Struct(">Q")  # an entry's log index, before the client's frame
FRAME_BYTES_MAX = 16 << 20
WORKLOADS = ("sync", "batch", f"{TOPICS} topics")  # the floor's rows, by bench.broker's names
RUN_S_MAX = 600.0  # one payload's rows, or the run gives up
START_S_MAX = 30.0  # a server's start, to the port it prints


class Framed(asyncio.Protocol):
    """Length-prefixed frames over one connection: ``on_frames(self, bodies)`` with the whole
    frames of each read (a group commit's unit), ``on_lost(self)`` when it closes."""

    def __init__(self, on_frames: Callable[[Framed, list[bytes]], None],
                 on_lost: Callable[[Framed], None] | None = None) -> None:
        self.on_frames = on_frames
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # (uvloop's are not)
        transport.get_extra_info("socket").setsockopt(6, 1, 1)  # TCP_NODELAY, as the broker's

    def connection_lost(self, exc: Exception | None) -> None:
        if self.on_lost is not None:
            self.on_lost(self)

    def data_received(self, data: bytes) -> None:
        buf, bodies, at = self._buf, [], 0
        buf += data
        while len(buf) - at >= FRAME.size:
            (n,) = FRAME.unpack_from(buf, at)
            if n > FRAME_BYTES_MAX:
                raise ValueError(f"frame of {n} bytes (at most {FRAME_BYTES_MAX})")
            if len(buf) - at < FRAME.size + n:
                break
            bodies.append(bytes(buf[at + FRAME.size:at + FRAME.size + n]))
            at += FRAME.size + n
        if bodies:
            del buf[:at]
            self.on_frames(self, bodies)

    def send(self, bodies: list[bytes]) -> None:
        """The frames, in one write."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionError("the floor's connection is closed")
        self.transport.write(b"".join(FRAME.pack(len(b)) + b for b in bodies))


class Replica:
    """One server's log file and its queues' next offsets."""

    def __init__(self, path: str, sync: bool) -> None:
        self.fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        self.sync = sync
        self.end_bytes = 0
        self.next_offsets: dict[str, int] = {}

    def append(self, entries: list[bytes]) -> None:
        """The entries in one write, then one fdatasync (``--flush sync``): a group commit."""
        data = b"".join(entries)
        os.pwrite(self.fd, data, self.end_bytes)
        self.end_bytes += len(data)
        if self.sync:
            os.fdatasync(self.fd)

    def apply(self, frame: bytes) -> list[int]:
        offsets, answers = self.next_offsets, []
        for topic, _body in cbor2.loads(frame):
            offset = offsets.get(topic, 0)
            offsets[topic] = offset + 1
            answers.append(offset)
        return answers


class Leader:
    """The leader's side: replicate, sync, count the first follower's ack, apply, answer."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.followers: list[Framed] = []
        self.last_index = self.applied = self.acked = 0
        self.pending: dict[int, tuple[Framed, bytes]] = {}

    def on_requests(self, client: Framed, frames: list[bytes]) -> None:
        entries = []
        for frame in frames:
            self.last_index += 1
            entries.append(INDEX.pack(self.last_index) + frame)
            self.pending[self.last_index] = (client, frame)
        for f in self.followers:  # before the leader's own fsync, as the broker does
            f.send(entries)
        self.replica.append(entries)
        self._commit()

    def on_acks(self, _follower: Framed, acks: list[bytes]) -> None:
        self.acked = max(self.acked, INDEX.unpack(acks[-1])[0])  # (each acks all before it)
        self._commit()

    def _commit(self) -> None:
        """Apply and answer what the leader and one follower hold durably, in log order."""
        answers: dict[Framed, list[bytes]] = {}
        while self.applied < min(self.acked, self.last_index):
            self.applied += 1
            client, frame = self.pending.pop(self.applied)
            answers.setdefault(client, []).append(cbor2.dumps(self.replica.apply(frame)))
        for client, bodies in answers.items():
            if client.transport is not None and not client.transport.is_closing():
                client.send(bodies)


def _on_entries(replica: Replica) -> Callable[[Framed, list[bytes]], None]:
    def on_entries(leader: Framed, entries: list[bytes]) -> None:
        replica.append(entries)
        leader.send([entries[-1][:INDEX.size]])  # the ack of all of them: written and synced
        for entry in entries:
            replica.apply(entry[INDEX.size:])
    return on_entries


def _peer_lost(what: str) -> Callable[[Framed], None]:
    """A benchmark's server: a broken group ends it, the leader's end failing the client's
    sends (the run stops the leader first, so that the followers' ends say nothing)."""
    def lost(_link: Framed) -> None:
        if what:
            print(f"bench.floor: {what}", file=sys.stderr, flush=True)
        os._exit(3)
    return lost


async def _serve(role: str, data_dir: str, sync: bool, followers: list[int]) -> None:
    loop = asyncio.get_running_loop()
    replica = Replica(os.path.join(data_dir, "log"), sync)
    if role == "follower":
        server = await loop.create_server(
            lambda: Framed(_on_entries(replica), _peer_lost("")),
            "127.0.0.1", 0)
    else:
        leader = Leader(replica)
        for port in followers:
            _, proto = await loop.create_connection(
                lambda: Framed(leader.on_acks, _peer_lost("the leader lost a follower")),
                "127.0.0.1", port)
            leader.followers.append(proto)
        server = await loop.create_server(lambda: Framed(leader.on_requests), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await loop.run_in_executor(None, sys.stdin.read)  # until the bench closes our stdin


class FloorClient:
    """One connection to the leader: the sends made in one loop turn leave in one frame (as our
    producer's), a batch in a frame of its own (as our producer's ``send_batch``)."""

    def __init__(self) -> None:
        self.proto: Framed | None = None
        self._waiting: collections.deque[list[asyncio.Future[int]]] = collections.deque()
        self._gathered: list[tuple[str, bytes]] = []
        self._futures: list[asyncio.Future[int]] = []

    @classmethod
    async def connect(cls, port: int) -> FloorClient:
        client = cls()
        _, client.proto = await asyncio.get_running_loop().create_connection(
            lambda: Framed(client._answered, client._lost), "127.0.0.1", port)
        return client

    def _answered(self, _proto: Framed, bodies: list[bytes]) -> None:
        for body in bodies:  # (the answers come in the order of the frames)
            for fut, offset in zip(self._waiting.popleft(), cbor2.loads(body)):
                if not fut.done():
                    fut.set_result(offset)

    def _lost(self, _proto: Framed) -> None:
        for futures in self._waiting:
            for fut in futures:
                if not fut.done():
                    fut.set_exception(ConnectionError("the floor's leader closed the connection"))
        self._waiting.clear()

    def send(self, topic: str, body: bytes) -> asyncio.Future[int]:
        if not self._gathered:
            asyncio.get_running_loop().call_soon(self._flush)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._gathered.append((topic, body))
        self._futures.append(fut)
        return fut

    def _flush(self) -> None:
        if self._gathered:  # (a batch may have sent them already)
            self._write(self._gathered, self._futures)
            self._gathered, self._futures = [], []

    def _write(self, messages: list[tuple[str, bytes]], futures: list[asyncio.Future[int]]) -> None:
        assert self.proto is not None
        self.proto.send([cbor2.dumps(messages)])
        self._waiting.append(futures)

    async def send_batch(self, messages: list[tuple[str, bytes]]) -> list[int]:
        self._flush()  # (what was gathered goes first, in its own frame)
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[int]] = [loop.create_future() for _ in messages]
        self._write(messages, futures)
        return list(await asyncio.gather(*futures))

    def close(self) -> None:
        if self.proto is not None and self.proto.transport is not None:
            self.proto.transport.close()


async def _floor_rows(port: int, servers: Servers, size: int, n: int, mode: str) -> list[Row]:
    client = await FloorClient.connect(port)
    body, rows = os.urandom(size), []
    cpu0 = servers.cpu_s()
    count = max(200, n // 10)
    tput, p50, p99 = await closed(lambda: client.send("x", body), count, 1)
    rows.append(servers.measured(Row(FLOOR, mode, "sync", size, tput, p50, p99), cpu0,
                                 count + warm_up(count)))
    batch = [("x", body)] * BATCH
    cpu0 = servers.cpu_s()
    sent, rate = await pipelined(lambda: client.send_batch(batch), BATCH, n, BATCHES_IN_FLIGHT)
    rows.append(servers.measured(Row(FLOOR, mode, "batch", size, rate), cpu0, sent))
    calls = [lambda i=i: client.send(f"t{i}", body) for i in range(TOPICS)]
    cpu0 = servers.cpu_s()
    tput, p50, p99 = await closed(calls[0], n, TOPICS, per_caller=calls)
    rows.append(servers.measured(Row(FLOOR, mode, f"{TOPICS} topics", size, tput, p50, p99),
                                 cpu0, n + warm_up(n)))
    client.close()
    return rows


def run_floor(size: int, n: int, mode: str,
              started: list[subprocess.Popen[str]] | None = None) -> list[Row]:
    """The floor's rows: a fresh group of three server processes (put in ``started`` too, if
    given), stopped by their PIDs."""
    procs: list[subprocess.Popen[str]] = [] if started is None else started

    def start(*args: str) -> int:
        p = subprocess.Popen([sys.executable, "-m", "bench.floor", "serve", "--flush", mode,
                              *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout is not None
        if not select.select([p.stdout], [], [], START_S_MAX)[0]:
            raise RuntimeError(f"a floor server printed no port within {START_S_MAX:g} s")
        line = p.stdout.readline()  # the port; empty if the server died first
        if not line.strip().isdigit():
            raise RuntimeError(f"a floor server did not start (exit code {p.wait(timeout=10)})")
        return int(line)

    with tempfile.TemporaryDirectory(prefix="dledger-floor-") as d:
        try:
            followers = [start("--dir", os.path.join(d, f"f{i}")) for i in (1, 2)]
            port = start("--dir", os.path.join(d, "leader"),
                         "--followers", ",".join(map(str, followers)))
            rows = _floor_rows(port, Servers([p.pid for p in procs]), size, n, mode)
            try:
                return asyncio.run(asyncio.wait_for(rows, RUN_S_MAX))
            except TimeoutError:
                raise RuntimeError(f"the floor's rows did not end within {RUN_S_MAX:g} s") from None
        finally:
            for p in reversed(procs):  # (the leader first)
                p.kill()
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    print(f"bench.floor: server {p.pid} still running after SIGKILL",
                          file=sys.stderr)


def ratios(rows: list[Row]) -> list[str]:
    """The floor's rows and ours (when measured) against NATS's of the same workload and payload,
    with issue 37's bar beside each; and ours against the floor's: how far the broker's own work
    puts it above the floor."""
    by = {(r.system, r.workload, r.payload_bytes): r for r in rows}
    lines = []
    for r in rows:
        if r.system not in (FLOOR, OURS):
            continue
        for peer_system in (NATS, FLOOR):
            peer = by.get((peer_system, r.workload, r.payload_bytes))
            if peer is not None and peer is not r:
                lines.append(_ratio(r, peer))
    return lines


def _ratio(r: Row, peer: Row) -> str:
    bar = peer.system == NATS  # (the bar is against NATS)
    topics = r.workload.endswith("topics")
    head = (f"{r.payload_bytes} B {'one producer' if r.workload == 'sync' else r.workload} "
            f"{r.mode}, {r.system} against {peer.system}:")
    if r.workload == "sync" and r.p50_ms and peer.p50_ms:
        head += f" p50 {r.p50_ms / peer.p50_ms:.2f}x" + (" (bar <= 1.2x)" if bar else "")
    else:
        head += (f" msg/s {r.msgs_per_s / peer.msgs_per_s:.2f}x"
                 + (f" (bar >= {'1.5x' if topics else '3x'})" if bar else ""))
    if r.cpu_s_per_10k and peer.cpu_s_per_10k:
        head += (f", servers' CPU {r.cpu_s_per_10k / peer.cpu_s_per_10k:.2f}x"
                 + (" (bar <= 1x)" if bar and (topics or r.workload == "sync") else ""))
    return head


def _table(rows: list[Row]) -> str:
    out = ["| system | flush | workload | payload | msg/s | p50 ms | CPU s / 10k |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        p50 = f"{r.p50_ms:.3f}" if r.p50_ms is not None else "-"
        out.append(f"| {r.system} | {r.mode} | {r.workload} | {r.payload_bytes} | "
                   f"{r.msgs_per_s:,.0f} | {p50} | {r.cpu_s_per_10k} |")
    return "\n".join(out)


@click.group(invoke_without_command=True)
@click.option("--payloads", default="128,1024", show_default=True)
@click.option("--messages", "n", type=click.IntRange(640, 10_000_000), default=20_000,
              show_default=True, help="messages in each throughput row (a tenth one at a time)")
@click.option("--flush", "mode", type=click.Choice(["sync", "async"]), default="sync",
              show_default=True)
@click.option("--nats/--no-nats", default=True, show_default=True,
              help="NATS JetStream R3 in the same run (needs nats-server and nats-py)")
@click.option("--ours/--no-ours", default=False, show_default=True,
              help="our broker's same rows in the same run (a 3-node group, `dledger bench`'s)")
@click.pass_context
def main(ctx: click.Context, payloads: str, n: int, mode: str, nats: bool, ours: bool) -> None:
    """The floor under issue 37's rows, beside NATS in the same run."""
    if ctx.invoked_subcommand is not None:
        return
    sizes = [int(s) for s in payloads.split(",")]
    if nats and (why := nats_available()) is not None:
        raise click.UsageError(why)
    rows: list[Row] = []
    for size in sizes:
        rows += run_floor(size, n, mode)
        if ours:
            rows += [r for r in run_ours(mode, size, n, topics=TOPICS) if r.workload in WORKLOADS]
        if nats:  # (its consume row is not one of the floor's)
            rows += [replace(r, note="") for r in run_nats(size, n, topics=TOPICS)
                     if r.workload in WORKLOADS]
    click.echo(_table(rows))
    for line in ratios(rows):
        click.echo(line)


@main.command("serve", hidden=True)
@click.option("--flush", "mode", type=click.Choice(["sync", "async"]), default="sync")
@click.option("--dir", "data_dir", required=True)
@click.option("--followers", default="", help="the followers' ports: this one leads")
def serve(mode: str, data_dir: str, followers: str) -> None:
    from dledger.evloop import run
    os.makedirs(data_dir, exist_ok=True)
    ports = [int(p) for p in followers.split(",") if p]
    run(_serve("leader" if ports else "follower", data_dir, mode == "sync", ports), server=True)


def _main(argv: list[str] | None = None) -> Any:
    return main.main(args=argv, prog_name="python -m bench.floor")


if __name__ == "__main__":
    _main()
