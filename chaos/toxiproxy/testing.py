"""Small blocking helpers for tests that push bytes through a proxy on loopback.

Owns an ``EchoServer`` (a thread per connection, everything closed on ``stop``), a one-shot
``Listener`` that hands the test the server side of a connection, and bounded waiting and reading
helpers (every call has a deadline; nothing sleeps to wait for a condition). Test support only:
the server and data plane never import it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

from chaos.toxiproxy.client import ENV_URL
from chaos.toxiproxy.server import ServerThread
from dledger.localcluster import free_ports

DEFAULT_TIMEOUT_S = 5.0
POLL_INTERVAL_S = 0.005


class WaitTimeout(AssertionError):
    """A condition did not become true before its deadline."""


@contextlib.contextmanager
def toxiproxy_api() -> Iterator[str]:
    """The API URL to test against: ``$TOXIPROXY_URL`` if set, else an embedded server."""
    url = os.environ.get(ENV_URL)
    if url:
        yield url
        return
    with ServerThread() as server:
        yield server.url


def free_port() -> int:
    """A port that was free a moment ago (for tests that need a fixed listen address), chosen
    below the ephemeral range as the cluster harness does (see free_ports)."""
    return free_ports(1)[0]


def wait_until(condition: Callable[[], object], timeout_s: float = DEFAULT_TIMEOUT_S,
               what: str = "condition") -> None:
    deadline_s = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline_s:
            raise WaitTimeout(f"{what} not reached within {timeout_s} s")
        time.sleep(POLL_INTERVAL_S)


def connect(address: tuple[str, int], timeout_s: float = DEFAULT_TIMEOUT_S) -> socket.socket:
    sock = socket.create_connection(address, timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv_exactly(sock: socket.socket, count: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> bytes:
    """Read exactly ``count`` bytes; raises WaitTimeout / EOFError instead of waiting forever."""
    deadline_s = time.monotonic() + timeout_s
    parts, received = [], 0
    while received < count:
        remaining_s = deadline_s - time.monotonic()
        if remaining_s <= 0:
            raise WaitTimeout(f"got {received} of {count} bytes within {timeout_s} s")
        sock.settimeout(remaining_s)
        try:
            data = sock.recv(min(65536, count - received))
        except TimeoutError as exc:
            raise WaitTimeout(f"got {received} of {count} bytes within {timeout_s} s") from exc
        if not data:
            raise EOFError(f"EOF after {received} of {count} bytes")
        parts.append(data)
        received += len(data)
    return b"".join(parts)


def read_to_end(sock: socket.socket, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[bytes, str]:
    """Read until the peer closes: returns (data, ``"eof"`` or ``"reset"``)."""
    deadline_s = time.monotonic() + timeout_s
    parts: list[bytes] = []
    while True:
        remaining_s = deadline_s - time.monotonic()
        if remaining_s <= 0:
            raise WaitTimeout(f"no EOF within {timeout_s} s")
        sock.settimeout(remaining_s)
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return b"".join(parts), "reset"
        except TimeoutError as exc:
            raise WaitTimeout(f"no EOF within {timeout_s} s") from exc
        if not data:
            return b"".join(parts), "eof"
        parts.append(data)


class Listener:
    """A listening socket whose accepted connections the test reads and writes itself."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))

    @property
    def upstream(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def accept(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> socket.socket:
        self.sock.settimeout(timeout_s)
        conn, _ = self.sock.accept()
        conn.settimeout(timeout_s)
        return conn

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class EchoServer:
    """Echoes every byte back on every connection, one thread per connection."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._stopped = False

    @property
    def upstream(self) -> str:
        return f"127.0.0.1:{self._listener.getsockname()[1]}"

    def start(self) -> EchoServer:
        self._spawn(self._accept_loop)
        return self

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # listener closed by stop()
                return
            with self._lock:
                if self._stopped:
                    conn.close()
                    return
                self._conns.append(conn)
            self._spawn(self._echo, conn)

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        try:
            while data := conn.recv(65536):
                conn.sendall(data)
        except OSError:  # reset by the proxy, or closed by stop(): the connection is over
            return
        finally:
            conn.close()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            conns, self._conns = self._conns, []
        # shutdown() wakes the blocked accept() on Linux; where unsupported, close() still
        # stops new accepts.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for conn in conns:
            with contextlib.suppress(OSError):  # already closed by its echo thread
                conn.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(DEFAULT_TIMEOUT_S)

    def __enter__(self) -> EchoServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


__all__ = ["EchoServer", "Listener", "WaitTimeout", "connect", "free_port", "read_to_end",
           "recv_exactly", "toxiproxy_api", "wait_until"]
