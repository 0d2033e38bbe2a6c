"""The client port's shared limits, on real server processes (the broker and the log server):
partial frames held by all connections stay within ``--input-buffer-bytes-max`` (the server's own
accounting, read from its status), the connections holding the most are closed, a connection
past ``--max-connections`` is answered OVERLOADED and closed, and a normal client is served
throughout and afterwards."""

from __future__ import annotations

import asyncio
import socket
import struct
from pathlib import Path
from typing import Any

import pytest

from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from protocol import broker_kinds as bp
from protocol.envelope import PROPOSE, STATUS, decode_response
from protocol.errors import DLedgerError, OverloadedError
from protocol.frames import FrameDecoder
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow

BUDGET_BYTES = 4_000_000
CONNECTIONS_MAX = 8
PARTIAL_BYTES = 1_000_000  # of a frame announced as 15 MB: never completed
HOLDERS = 6  # 6 MB of partial frames against a 4 MB budget

SERVERS = {
    "broker": (("-m", "broker", "start"), bp.BROKER_STATUS),
    "log": (("-m", "dledger.server"), STATUS),
}


def closed_by_server(s: socket.socket) -> bool:
    """Whether the server closed ``s`` (EOF or reset); False while it stays open."""
    s.setblocking(False)
    try:
        return s.recv(65536) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


async def normal_request(client: LogClient, kind: str) -> Any:
    if kind == "broker":
        return await client.call("n0", bp.SEND, "t", 0, [[b"ok", "", [], "", [], 0]])
    return await client.call("n0", PROPOSE, b"ok")


@pytest.mark.parametrize("kind", sorted(SERVERS))
def test_partial_frames_stay_within_the_budget_and_connections_within_the_limit(
        tmp_path: Path, kind: str) -> None:
    program, status_kind = SERVERS[kind]
    opened: list[socket.socket] = []

    async def run(cluster: LocalCluster) -> None:
        addr = cluster.servers["n0"].client_address
        async with LogClient(cluster.client_addresses, timeout_s=5.0) as client:
            async def stats() -> dict[str, int]:
                return dict((await client.call("n0", status_kind))["client_connections"])

            async def leads() -> bool:
                try:
                    await normal_request(client, kind)
                    return True
                except DLedgerError:
                    return False

            await wait_until(leads, 30, "the node to lead")
            holders = [socket.create_connection(addr, timeout=5) for _ in range(HOLDERS)]
            opened.extend(holders)
            for s in holders:
                s.sendall(struct.pack(">I", 15_000_000) + b"x" * PARTIAL_BYTES)
            await wait_until(lambda: sum(map(closed_by_server, holders)) >= 2, 10,
                             "the largest holders to be closed")
            st = await stats()
            assert st["input_buffered_bytes"] <= BUDGET_BYTES
            assert st["evicted"] >= 2 and st["input_buffer_bytes_max"] == BUDGET_BYTES
            await normal_request(client, kind)  # served while the budget is under pressure
            for s in holders:
                s.close()
            await wait_until(lambda: _open_is(stats, 1), 10, "the holders to be gone")
            assert (await stats())["input_buffered_bytes"] == 0
            idle = [socket.create_connection(addr, timeout=5)
                    for _ in range(CONNECTIONS_MAX - 1)]  # with the client's own: at the limit
            opened.extend(idle)
            await wait_until(lambda: _open_is(stats, CONNECTIONS_MAX), 10, "the idle connections")
            over = socket.create_connection(addr, timeout=5)
            opened.append(over)
            answer = _read_until_closed(over)
            assert answer is not None and answer.code == "OVERLOADED", answer
            assert "too many connections" in answer.message
            async with LogClient(cluster.client_addresses, timeout_s=5.0) as late:
                with pytest.raises(OverloadedError, match="too many connections"):
                    await late.call("n0", status_kind)  # named, not "connection lost"
            st = await stats()
            assert st["refused"] == 2 and st["open"] == CONNECTIONS_MAX
            for s in idle:
                s.close()
            await wait_until(lambda: _open_is(stats, 1), 10, "the idle connections to be gone")
        async with LogClient(cluster.client_addresses, timeout_s=5.0) as fresh:
            await normal_request(fresh, kind)  # a new client is served afterwards

    try:
        with LocalCluster(str(tmp_path), size=1, tick_ms=50, program=program,
                          extra_args=("--max-connections", str(CONNECTIONS_MAX),
                                      "--input-buffer-bytes-max", str(BUDGET_BYTES))) as cluster:
            asyncio.run(run(cluster))
    finally:
        for s in opened:
            s.close()


async def _open_is(stats: Any, n: int) -> bool:
    return bool((await stats())["open"] == n)


def _read_until_closed(s: socket.socket) -> Any:
    """The first response frame on ``s``, once the server closed it (None if it sent none)."""
    s.settimeout(5)
    decoder = FrameDecoder(1 << 20)
    frames: list[bytes] = []
    for _ in range(100):
        chunk = s.recv(65536)
        if not chunk:
            break
        frames += decoder.feed(chunk)
    return decode_response(frames[0]) if frames else None
