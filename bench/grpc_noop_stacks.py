"""The gRPC ceiling on another server stack: the no-op server of ``bench.grpc_noop`` written on
``grpclib`` (a pure-Python HTTP/2 gRPC server on asyncio, over ``h2``) instead of ``grpcio``'s
C core, driven by the same official client with the same workload, beside the ``grpcio`` no-op
and our own client against a broker group, all in one run. It answers whether a different
server stack could bring the gateway's CPU per message or its one-at-a-time p50 under what
``grpcio`` allows (issue 31's bar): a server that does nothing costs at least this much.

``grpclib`` is not a dependency of the project: install it where this tool can import it
(``pip install --target DIR grpclib`` and ``DLEDGER_GRPCLIB_PATH=DIR``, or into the virtual
environment). A tool, not a test: ``python -m bench.grpc_noop_stacks --payloads 128,1024``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from bench.grpc import CONCURRENCY, NOOP, our_rows, rocketmq_rows
from bench.grpc_noop import NoopServer, settings_answer
from bench.harness import Row, Servers, broker_group
from bench.nodeflags import NodeFlags

GRPCLIB = "RocketMQ5 no-op (grpclib)"
SERVICE = "/apache.rocketmq.v2.MessagingService/"


def _handlers(port: Callable[[], int]) -> dict[str, Any]:
    """grpclib's method table for the calls the official client makes to start and send."""
    from grpclib.const import Cardinality, Handler  # type: ignore[import-not-found]
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as sv

    def ok() -> Any:
        return pb.Status(code=pb.Code.OK, message="OK")

    async def query_route(stream: Any) -> None:
        request = await stream.recv_message()
        mq = pb.MessageQueue(id=0, permission=pb.Permission.READ_WRITE,
                             accept_message_types=[pb.MessageType.NORMAL])
        mq.topic.CopyFrom(request.topic)
        mq.broker.name = "noop"
        mq.broker.endpoints.scheme = pb.AddressScheme.IPv4
        mq.broker.endpoints.addresses.add(host="127.0.0.1", port=port())
        await stream.send_message(sv.QueryRouteResponse(status=ok(), message_queues=[mq]))

    async def heartbeat(stream: Any) -> None:
        await stream.recv_message()
        await stream.send_message(sv.HeartbeatResponse(status=ok()))

    async def terminated(stream: Any) -> None:
        await stream.recv_message()
        await stream.send_message(sv.NotifyClientTerminationResponse(status=ok()))

    async def send_message(stream: Any) -> None:
        request = await stream.recv_message()
        m = request.messages[0]
        await stream.send_message(sv.SendMessageResponse(status=ok(), entries=[
            sv.SendResultEntry(status=ok(), message_id=m.system_properties.message_id,
                               offset=0)]))

    async def telemetry(stream: Any) -> None:
        async for cmd in stream:
            if cmd.WhichOneof("command") == "settings":
                await stream.send_message(settings_answer(cmd))

    unary, both = Cardinality.UNARY_UNARY, Cardinality.STREAM_STREAM
    return {
        SERVICE + "QueryRoute": Handler(query_route, unary, sv.QueryRouteRequest,
                                        sv.QueryRouteResponse),
        SERVICE + "Heartbeat": Handler(heartbeat, unary, sv.HeartbeatRequest,
                                       sv.HeartbeatResponse),
        SERVICE + "NotifyClientTermination": Handler(
            terminated, unary, sv.NotifyClientTerminationRequest,
            sv.NotifyClientTerminationResponse),
        SERVICE + "SendMessage": Handler(send_message, unary, sv.SendMessageRequest,
                                         sv.SendMessageResponse),
        SERVICE + "Telemetry": Handler(telemetry, both, sv.TelemetryCommand, sv.TelemetryCommand),
    }


def _serve(conn: Any, path: str) -> None:
    """The child process: the grpclib no-op on a free port of 127.0.0.1 until told to stop."""
    if path:
        sys.path.insert(0, path)
    from grpclib.server import Server  # type: ignore[import-not-found]

    async def main() -> None:
        bound = [0]

        class Service:
            def __mapping__(self) -> dict[str, Any]:
                return _handlers(lambda: bound[0])

        server = Server([Service()])
        await server.start("127.0.0.1", 0)
        bound[0] = server._server.sockets[0].getsockname()[1]
        conn.send(bound[0])
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def grpclib_noop() -> NoopServer:
    """``NoopServer`` with the grpclib child instead of the grpcio one."""
    return NoopServer(_serve, (os.environ.get("DLEDGER_GRPCLIB_PATH", ""),),
                      "the grpclib no-op server (is grpclib installed? see this module's docstring)")


def run(size: int, n: int) -> list[Row]:
    body = os.urandom(size)
    with broker_group("sync", NodeFlags()) as (ns, cluster):
        servers = Servers([s.proc.pid for s in cluster.servers.values() if s.proc is not None])
        ours = asyncio.run(our_rows(ns, servers, f"bench-ours-{size}", body, n))
    rows = list(ours)
    for server, system in ((NoopServer(), NOOP), (grpclib_noop(), GRPCLIB)):
        with server as s:
            rows += rocketmq_rows(s.address, Servers([s.pid]), f"bench-noop-{size}", body, n, system)
    by = {r.workload: r for r in ours}
    for r in rows[len(ours):]:
        mine = by[r.workload]
        if mine.msgs_per_s and mine.p50_ms and r.p50_ms:
            r.note = (f"{r.msgs_per_s / mine.msgs_per_s:.2f}x our client's msgs/s, "
                      f"p50 {r.p50_ms / mine.p50_ms:.2f}x")
        if mine.cpu_s_per_10k and r.cpu_s_per_10k:
            r.note += f", CPU {r.cpu_s_per_10k / mine.cpu_s_per_10k:.1f}x"
    return rows


@click.command()
@click.option("--payloads", default="128,1024", show_default=True)
@click.option("--messages", "n", type=click.IntRange(min=CONCURRENCY), default=5000,
              show_default=True, help="sends in flight's workload (one at a time: a tenth)")
def main(payloads: str, n: int) -> None:
    for size in (int(p) for p in payloads.split(",")):
        for r in run(size, n):
            print(f"{r.system:28} {r.workload:10} {size:5} B {r.msgs_per_s:9.0f} msg/s "
                  f"p50 {r.p50_ms or 0:.3f} ms  CPU/10k {r.cpu_s_per_10k or 0:.3f} s  {r.note}")


if __name__ == "__main__":
    main()


__all__ = ["GRPCLIB", "grpclib_noop", "run"]
