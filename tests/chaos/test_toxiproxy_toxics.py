"""Data-plane behaviour of each toxic on loopback (docs/toxiproxy.md).

Tolerances are generous: the machine has 2 shared cores. Every wait has a deadline; nothing
sleeps to wait for a condition. Set TOXIPROXY_URL to run against a real Toxiproxy.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import time

import pytest

from chaos.toxiproxy.client import ToxiproxyClient, listen_address
from chaos.toxiproxy.testing import EchoServer, Listener, connect, read_to_end, recv_exactly, toxiproxy_api

pytestmark = pytest.mark.timeout(60)
_names = itertools.count()


@pytest.fixture(scope="module")
def env():
    with toxiproxy_api() as url, EchoServer() as echo:
        client = ToxiproxyClient(url)
        yield client, echo.upstream
        client.destroy_all()


@pytest.fixture()
def client(env):
    yield env[0]
    env[0].destroy_all()


def proxy_to(client: ToxiproxyClient, upstream: str) -> tuple[str, tuple[str, int]]:
    name = f"t{next(_names)}"
    return name, listen_address(client.create_proxy(name, upstream))


@pytest.fixture()
def echo_proxy(env):
    client, upstream = env
    return proxy_to(client, upstream)


def round_trip_s(sock: socket.socket, payload: bytes = b"x" * 16) -> float:
    started_s = time.monotonic()
    sock.sendall(payload)
    assert recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - started_s


def test_latency_delays_each_direction_and_adds_up(client, echo_proxy):
    name, address = echo_proxy
    with connect(address) as sock:
        assert round_trip_s(sock) < 0.1
        client.add_toxic(name, "latency", attributes={"latency": 200})
        assert 0.15 <= round_trip_s(sock) < 1.0
        client.add_toxic(name, "latency", stream="upstream", attributes={"latency": 100})
        assert 0.25 <= round_trip_s(sock) < 1.5
        client.remove_toxic(name, "latency_downstream")
        client.remove_toxic(name, "latency_upstream")
        assert round_trip_s(sock) < 0.1


def test_latency_jitter_stays_in_range(client, echo_proxy):
    name, address = echo_proxy
    client.add_toxic(name, "latency", attributes={"latency": 100, "jitter": 50})
    with connect(address) as sock:
        samples_s = [round_trip_s(sock) for _ in range(5)]
    assert all(0.04 <= s < 0.6 for s in samples_s), samples_s


def test_toxicity_zero_never_applies_and_one_always_does(client, echo_proxy):
    name, address = echo_proxy
    client.add_toxic(name, "latency", toxicity=0.0, attributes={"latency": 300})
    with connect(address) as sock:
        assert round_trip_s(sock) < 0.2
    client.update_toxic(name, "latency_downstream", toxicity=1.0)
    with connect(address) as sock:
        assert round_trip_s(sock) >= 0.25


def test_bandwidth_limits_rate(client, echo_proxy):
    name, address = echo_proxy
    client.add_toxic(name, "bandwidth", attributes={"rate": 100})  # 100 KB/s
    payload = bytes(range(256)) * 200  # 51,200 bytes: ~0.5 s at 100 KB/s
    with connect(address) as sock:
        elapsed_s = round_trip_s(sock, payload)
    assert 0.3 <= elapsed_s < 2.0, elapsed_s


def test_bandwidth_zero_stalls_then_delivers_on_removal(client, echo_proxy):
    name, address = echo_proxy
    client.add_toxic(name, "bandwidth", attributes={"rate": 0})
    with connect(address) as sock:
        sock.sendall(b"held data")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(100)
        client.remove_toxic(name, "bandwidth_downstream")
        assert recv_exactly(sock, 9) == b"held data"


def test_slow_close_delays_the_close(client):
    with Listener() as upstream:
        name, address = proxy_to(client, upstream.upstream)
        client.add_toxic(name, "slow_close", attributes={"delay": 300})
        with connect(address) as sock, upstream.accept() as server:
            server.sendall(b"bye")
            assert recv_exactly(sock, 3) == b"bye"
            closed_s = time.monotonic()
            server.close()
            assert read_to_end(sock) == (b"", "eof")
            assert time.monotonic() - closed_s >= 0.25


def test_timeout_discards_then_closes_after_idle(client):
    with Listener() as upstream:
        name, address = proxy_to(client, upstream.upstream)
        client.add_toxic(name, "timeout", stream="upstream", attributes={"timeout": 300})
        with connect(address) as sock, upstream.accept() as server:
            started_s = time.monotonic()
            sock.sendall(b"swallowed")
            assert read_to_end(sock) == (b"", "eof")
            assert time.monotonic() - started_s >= 0.25
            assert read_to_end(server)[0] == b""  # nothing got through


def test_timeout_zero_holds_and_removal_closes_both_sides(client):
    with Listener() as upstream:
        name, address = proxy_to(client, upstream.upstream)
        client.add_toxic(name, "timeout", stream="upstream", attributes={"timeout": 0})
        with connect(address) as sock, upstream.accept() as server:
            sock.sendall(b"lost")
            server.settimeout(0.3)
            with pytest.raises(TimeoutError):
                server.recv(10)
            client.remove_toxic(name, "timeout_upstream")
            assert read_to_end(sock)[1] in ("eof", "reset")
            assert read_to_end(server) == (b"", "eof")


def test_reset_peer_resets_the_client(client, echo_proxy):
    name, address = echo_proxy
    client.add_toxic(name, "reset_peer", stream="upstream", attributes={"timeout": 100})
    with connect(address) as sock:
        started_s = time.monotonic()
        sock.sendall(b"request")
        assert read_to_end(sock) == (b"", "reset")
        assert time.monotonic() - started_s >= 0.08


def test_slicer_delivers_everything_in_pieces(client):
    with Listener() as upstream:
        name, address = proxy_to(client, upstream.upstream)
        client.add_toxic(name, "slicer", attributes={"average_size": 10, "size_variation": 5,
                                                     "delay": 1000})
        payload = bytes(range(256)) * 8
        with connect(address) as sock, upstream.accept() as server:
            server.sendall(payload)
            server.close()
            reads = []
            while (data := sock.recv(65536)) != b"":
                reads.append(data)
    assert b"".join(reads) == payload
    assert len(reads) > 20 and max(map(len, reads)) < 1000


def test_limit_data_closes_after_n_bytes(client):
    with Listener() as upstream:
        name, address = proxy_to(client, upstream.upstream)
        client.add_toxic(name, "limit_data", attributes={"bytes": 1000})
        payload = bytes(range(250)) * 12
        with connect(address) as sock, upstream.accept() as server:
            server.sendall(payload)
            data, how = read_to_end(sock)
    assert data == payload[:1000] and how == "eof"


def test_limit_data_counts_across_chunks_and_updates(client, echo_proxy):
    name, address = echo_proxy
    client.add_toxic(name, "limit_data", attributes={"bytes": 10})
    with connect(address) as sock:
        assert round_trip_s(sock, b"abcd") >= 0
        client.update_toxic(name, "limit_data_downstream", attributes={"bytes": 12})
        sock.sendall(b"efghijkl")  # 4 sent so far: 8 more allowed, so all of this passes
        assert recv_exactly(sock, 8) == b"efghijkl"
        sock.sendall(b"mnop")
        # Nothing past the limit arrives and the connection ends; a FIN or an RST depending on
        # whether the proxy still had unread bytes from us when it closed (a kernel race).
        data, how = read_to_end(sock)
        assert data == b"" and how in ("eof", "reset")


def test_disable_drops_connections_and_refuses_new_ones(client, echo_proxy):
    name, address = echo_proxy
    with connect(address) as sock:
        round_trip_s(sock)
        client.disable(name)
        assert read_to_end(sock)[0] == b""
    with pytest.raises(ConnectionRefusedError):
        connect(address)
    client.enable(name)
    with connect(address) as sock:
        round_trip_s(sock)


def test_delete_drops_connections(client, echo_proxy):
    name, address = echo_proxy
    with connect(address) as sock:
        round_trip_s(sock)
        client.delete_proxy(name)
        assert read_to_end(sock)[0] == b""
    with pytest.raises(ConnectionRefusedError):
        connect(address)


def test_unreachable_upstream_closes_the_client(client):
    with Listener() as gone:
        upstream = gone.upstream
    _, address = proxy_to(client, upstream)  # nothing listens there any more
    with connect(address) as sock:
        assert read_to_end(sock) == (b"", "eof")


def test_half_close_ends_the_whole_connection(client):
    """Toxiproxy has no half-close: a client that shuts down writing gets no reply. Documented
    here so that nobody builds on it."""
    with Listener() as upstream:
        _name, address = proxy_to(client, upstream.upstream)
        with connect(address) as sock, upstream.accept() as server:
            sock.sendall(b"req")
            sock.shutdown(socket.SHUT_WR)
            assert read_to_end(server) == (b"req", "eof")
            with contextlib.suppress(OSError):  # the proxy may have closed this socket already
                server.sendall(b"reply")
            assert read_to_end(sock)[0] == b""
