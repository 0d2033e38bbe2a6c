"""The ceiling of ``dledger bench --grpc``: a gRPC server whose SendMessage answers OK at once and
stores nothing, set up as the brokers' gateway sets up its ``grpc.aio`` server (the same options,
``broker.frontends.grpc.gateway.server_options``), serving just enough of
``apache.rocketmq.v2.MessagingService`` for the official client to start (QueryRoute naming
itself, Heartbeat, Telemetry's settings) and send.

It runs in a process of its own (``NoopServer``), as a broker node does: sharing the benchmark's
process would make the client and the server take turns on one interpreter lock, and lower the
ceiling. Its CPU is measured as the brokers' is. A tool, not a test.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import AsyncIterator, Callable
from typing import Any

from broker.frontends.grpc.gateway import server_options

__all__ = ["NoopServer", "settings_answer"]


def _serve(conn: Any) -> None:
    """The child process: serve on a free port of 127.0.0.1, say which, until told to stop."""
    from grpc import aio
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as sv
    from rocketmq.grpc_protocol import service_pb2_grpc as sg

    def ok() -> Any:
        return pb.Status(code=pb.Code.OK, message="OK")

    class Noop(sg.MessagingServiceServicer):  # type: ignore[misc]
        port = 0

        async def QueryRoute(self, request: Any, context: Any) -> Any:
            mq = pb.MessageQueue(id=0, permission=pb.Permission.READ_WRITE,
                                 accept_message_types=[pb.MessageType.NORMAL])
            mq.topic.CopyFrom(request.topic)
            mq.broker.name = "noop"
            mq.broker.endpoints.scheme = pb.AddressScheme.IPv4
            mq.broker.endpoints.addresses.add(host="127.0.0.1", port=self.port)
            return sv.QueryRouteResponse(status=ok(), message_queues=[mq])

        async def Heartbeat(self, request: Any, context: Any) -> Any:
            return sv.HeartbeatResponse(status=ok())

        async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
            return sv.NotifyClientTerminationResponse(status=ok())

        async def SendMessage(self, request: Any, context: Any) -> Any:
            m = request.messages[0]
            return sv.SendMessageResponse(status=ok(), entries=[sv.SendResultEntry(
                status=ok(), message_id=m.system_properties.message_id, offset=0)])

        async def Telemetry(self, request_iterator: AsyncIterator[Any],
                            context: Any) -> AsyncIterator[Any]:
            async for cmd in request_iterator:
                if cmd.WhichOneof("command") == "settings":
                    yield settings_answer(cmd)

    async def main() -> None:
        server = aio.server(options=server_options())
        servicer = Noop()
        sg.add_MessagingServiceServicer_to_server(servicer, server)
        servicer.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        loop = asyncio.get_running_loop()
        conn.send(servicer.port)
        await loop.run_in_executor(None, conn.recv)  # until the parent says stop
        await server.stop(grace=0.2)

    asyncio.run(main())


def settings_answer(cmd: Any) -> Any:
    """The no-op's answer to a client's Telemetry settings: its own, with a backoff policy, a
    4 MiB body limit and metrics off."""
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as sv

    s = pb.Settings()
    s.CopyFrom(cmd.settings)
    s.backoff_policy.Clear()
    s.backoff_policy.max_attempts = 3
    s.backoff_policy.exponential_backoff.initial.FromMilliseconds(10)
    s.backoff_policy.exponential_backoff.max.FromMilliseconds(1000)
    s.backoff_policy.exponential_backoff.multiplier = 2.0
    s.publishing.max_body_size = 4 << 20
    s.metric.on = False
    return sv.TelemetryCommand(status=pb.Status(code=pb.Code.OK, message="OK"), settings=s)


class NoopServer:
    """The no-op server in a child process: ``with NoopServer() as s``: ``s.address``, ``s.pid``.
    ``child``: what the process runs, given the pipe and ``child_args`` (another server stack's
    no-op, ``bench.grpc_noop_stacks``)."""

    def __init__(self, child: Callable[..., None] = _serve, child_args: tuple[Any, ...] = (),
                 name: str = "the no-op gRPC server") -> None:
        self._child, self._child_args, self._name = child, child_args, name

    def __enter__(self) -> NoopServer:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=self._child, args=(child, *self._child_args),
                                 daemon=True)
        self._proc.start()
        if not self._conn.poll(30):
            self._proc.kill()
            raise RuntimeError(f"{self._name} did not start within 30 s")
        self.address = f"127.0.0.1:{self._conn.recv()}"
        assert self._proc.pid is not None  # (started)
        self.pid: int = self._proc.pid
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.send("stop")
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
