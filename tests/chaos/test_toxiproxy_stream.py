"""Streaming through live toxic changes, and the two ways to run the server.

The stream test ports the idea of Go's TestToxicAddRemove: about 1 MB is echoed through one open
connection while toxics are added, updated and removed on both streams, and the echo must be
byte-exact (removal flushes held data, docs/toxiproxy.md). Then: the embedded asyncio API
(``ToxiproxyServer`` in ``asyncio.run``) and the command ``python -m chaos.toxiproxy``.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import threading
import time

import aiohttp
import pytest
import requests

from chaos.toxiproxy import ToxiproxyServer
from chaos.toxiproxy.client import ToxiproxyClient, listen_address
from chaos.toxiproxy.testing import EchoServer, connect, recv_exactly, toxiproxy_api

pytestmark = pytest.mark.timeout(60)

STREAM_BYTES = 1 << 20
WRITE_BYTES = 8192
CHURN_ROUNDS_MAX = 300
TOXICS = [
    ("latency", {"latency": 5, "jitter": 5}),
    ("slicer", {"average_size": 2000, "size_variation": 500, "delay": 0}),
    ("bandwidth", {"rate": 20000}),
    ("noop", {}),
    ("slow_close", {"delay": 10}),
    ("limit_data", {"bytes": 1 << 30}),
]


def _send_all(sock, payload: bytes, errors: list[BaseException]) -> None:
    try:
        for start in range(0, len(payload), WRITE_BYTES):
            sock.sendall(payload[start:start + WRITE_BYTES])
    except OSError as exc:  # reported by the test, not swallowed
        errors.append(exc)


def _churn(client: ToxiproxyClient, name: str, rng: random.Random, done: threading.Event) -> int:
    """Add, update and remove toxics on both streams until ``done``; returns the rounds run."""
    rounds = 0
    while not done.is_set() and rounds < CHURN_ROUNDS_MAX:
        toxic_type, attributes = rng.choice(TOXICS)
        stream = rng.choice(["upstream", "downstream"])
        toxic = f"{toxic_type}_{stream}"
        if toxic not in client.toxics(name):
            client.add_toxic(name, toxic_type, stream=stream, attributes=attributes)
        elif toxic_type == "latency" and rng.random() < 0.5:
            client.update_toxic(name, toxic, attributes={"latency": rng.randrange(1, 10)})
        else:
            client.remove_toxic(name, toxic)
        rounds += 1
    return rounds


def test_one_megabyte_echo_is_exact_while_toxics_change():
    rng = random.Random(7)
    payload = rng.randbytes(STREAM_BYTES)
    with toxiproxy_api() as url, EchoServer() as echo:
        client = ToxiproxyClient(url)
        proxy = client.create_proxy("stream", echo.upstream)
        # A steady 1 MB/s base rate keeps the stream flowing for about a second, so the churn
        # below really happens while data is in flight.
        client.add_toxic("stream", "bandwidth", stream="upstream", name="base_rate",
                         attributes={"rate": 1000})
        done, errors = threading.Event(), []
        with connect(listen_address(proxy), timeout_s=30) as sock:
            sender = threading.Thread(target=_send_all, args=(sock, payload, errors))
            sender.start()
            churner_rounds: list[int] = []
            churner = threading.Thread(
                target=lambda: churner_rounds.append(_churn(client, "stream", rng, done)))
            churner.start()
            try:
                received = recv_exactly(sock, STREAM_BYTES, timeout_s=40)
            finally:
                done.set()
                churner.join(30)
                sender.join(30)
            print("churn rounds", churner_rounds)
        client.delete_proxy("stream")
    assert not errors
    assert received == payload
    assert churner_rounds and churner_rounds[0] >= 20, churner_rounds


def test_latency_update_releases_held_data_in_order():
    with toxiproxy_api() as url, EchoServer() as echo:
        client = ToxiproxyClient(url)
        proxy = client.create_proxy("upd", echo.upstream)
        client.add_toxic("upd", "latency", attributes={"latency": 5000})
        with connect(listen_address(proxy)) as sock:
            for i in range(20):
                sock.sendall(b"%03d" % i)
            started_s = time.monotonic()
            client.update_toxic("upd", "latency_downstream", attributes={"latency": 0})
            data = recv_exactly(sock, 60, timeout_s=3)
            assert time.monotonic() - started_s < 2.0
        client.delete_proxy("upd")
    assert data == b"".join(b"%03d" % i for i in range(20))


async def _embedded_round_trip() -> tuple[str, bytes, int]:
    handlers_done = asyncio.Event()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()
            handlers_done.set()

    echo_server = await asyncio.start_server(echo, "127.0.0.1", 0)
    upstream = f"127.0.0.1:{echo_server.sockets[0].getsockname()[1]}"
    server = ToxiproxyServer("127.0.0.1", 0)
    host, port = await server.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http, \
                http.post(f"http://{host}:{port}/proxies",
                          json={"name": "e", "upstream": upstream}) as reply:
            proxy = await reply.json()
            status = reply.status
        proxy_port = int(proxy["listen"].rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        writer.write(b"async hello")
        async with asyncio.timeout(5):
            echoed = await reader.readexactly(11)
            writer.close()
            await handlers_done.wait()  # the proxy passed the close on to the echo server
    finally:
        await server.stop()
        echo_server.close()
    return proxy["name"], echoed, status


def test_embedded_server_in_asyncio_run():
    assert asyncio.run(_embedded_round_trip()) == ("e", b"async hello", 201)


def test_command_line_server_serves_the_api():
    process = subprocess.Popen([sys.executable, "-m", "chaos.toxiproxy", "--host", "127.0.0.1",
                                "--port", "0"], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line_holder: list[str] = []
        reader = threading.Thread(target=lambda: line_holder.append(process.stdout.readline()))
        reader.start()
        reader.join(20)
        assert line_holder and "listening on" in line_holder[0], line_holder
        address = line_holder[0].split()[-1]
        reply = requests.get(f"http://{address}/version", timeout=10)
        assert reply.json() == {"version": "2.12.0"}
    finally:
        process.terminate()
        assert process.wait(10) == 0
        process.stdout.close()
