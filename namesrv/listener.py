"""One port for the NameServer's two protocols: HTTP (our clients, brokers, the console) and
RocketMQ's remoting protocol (4.x clients), told apart by a connection's first byte.

A remoting frame starts with its 4-byte big-endian length, whose first byte is 0 for any frame
the NameServer takes (under 16 MiB); an HTTP request starts with a method's letter and a TLS
connection is already decrypted here (the listener's TLS wraps both). So a RocketMQ user gives
4.x clients the same address (port 9876, as RocketMQ's) that everything else uses. A connection
that sends nothing within ``FIRST_BYTE_TIMEOUT_S`` is closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["FIRST_BYTE_TIMEOUT_S", "Sniffer"]

FIRST_BYTE_TIMEOUT_S = 30.0
ProtocolFactory = Callable[[], asyncio.Protocol]


class Sniffer(asyncio.Protocol):
    """Hands the connection to the remoting or the HTTP protocol on its first byte."""

    def __init__(self, http: ProtocolFactory, remoting: ProtocolFactory) -> None:
        self.http = http
        self.remoting = remoting
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._timer = asyncio.get_running_loop().call_later(FIRST_BYTE_TIMEOUT_S, transport.close)

    def data_received(self, data: bytes) -> None:
        if self._timer is not None:
            self._timer.cancel()
        transport = self.transport
        if transport is None or not data:
            return
        self.transport = None
        protocol = self.remoting() if data[0] == 0 else self.http()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        protocol.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.transport = None
