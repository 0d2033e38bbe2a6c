"""An asyncio protocol base for connections that carry length-prefixed frames (``wire``):
decodes incoming frames and coalesces outgoing ones into one write per loop pass; and the limits
that the connections of one listener share (``ConnectionLimits``).

Owns only framing on a live connection and its share of the listener's budget; what the payloads
mean is the subclass's business (``server`` answers requests, ``client`` matches responses). A
server's connection (one with limits) counts its errors (a bad frame, refused or evicted by the
limits, lost on an error) in the process's rate-limited summary, ``CLIENT_CONNECTION_ERRORS``:
never a log line per connection.
"""

from __future__ import annotations

import asyncio
from typing import cast

from protocol.envelope import encode_error
from protocol.errors import OverloadedError, WireError
from protocol.frames import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame
from protocol.log_summary import CLIENT_CONNECTION_ERRORS

CONNECTIONS_MAX_DEFAULT = 4096
INPUT_BUFFER_BYTES_MAX_DEFAULT = 128 << 20  # 32 batches of 4 MiB arriving at once
REFUSED_LINGER_S = 1.0  # a refused connection is aborted after this, whatever the client does


class ConnectionLimits:
    """What the connections of one listener (a server's client port) share: at most
    ``connections_max`` open at once (one more is answered with an OVERLOADED error and closed),
    and at most ``input_bytes_max`` bytes of partly received frames held by all of them together.
    A read that takes the total past the budget closes the connections holding the most, largest
    first, until the rest fit: a connection that sits on most of a large frame goes, a client
    sending small requests stays. Counted for status and metrics. Per listener, so that the
    peer port of a node (Raft traffic) is never starved by its client port."""

    def __init__(self, connections_max: int = CONNECTIONS_MAX_DEFAULT,
                 input_bytes_max: int = INPUT_BUFFER_BYTES_MAX_DEFAULT) -> None:
        if connections_max < 1 or input_bytes_max < 1:
            raise ValueError("connections_max and input_bytes_max must be positive")
        self.connections_max = connections_max
        self.input_bytes_max = input_bytes_max
        self.open: set[FramedProtocol] = set()
        self.held_bytes = 0
        self.refused = 0  # connections refused: the connection limit was reached
        self.evicted = 0  # connections closed to keep the held bytes within the budget

    def admit(self, conn: FramedProtocol) -> bool:
        if len(self.open) >= self.connections_max:
            self.refused += 1
            return False
        self.open.add(conn)
        return True

    def release(self, conn: FramedProtocol) -> None:
        self.open.discard(conn)
        self.held_bytes -= conn.held_bytes
        conn.held_bytes = 0

    def hold(self, conn: FramedProtocol, held_bytes: int) -> None:
        """``conn`` now holds ``held_bytes`` of partial frames; evict if over the budget."""
        self.held_bytes += held_bytes - conn.held_bytes
        conn.held_bytes = held_bytes
        if self.held_bytes <= self.input_bytes_max:
            return
        for victim in sorted(self.open, key=lambda c: c.held_bytes, reverse=True):
            if self.held_bytes <= self.input_bytes_max or victim.held_bytes == 0:
                break
            victim.note_error("evicted", f"closed holding {victim.held_bytes} bytes of a partial "
                              f"frame: the listener's {self.input_bytes_max}-byte input budget "
                              "is used up")
            self.evicted += 1
            self.release(victim)
            victim.evict()

    def stats(self) -> dict[str, int]:
        return {"open": len(self.open), "max": self.connections_max, "refused": self.refused,
                "input_buffered_bytes": self.held_bytes,
                "input_buffer_bytes_max": self.input_bytes_max, "evicted": self.evicted}


class FramedProtocol(asyncio.Protocol):
    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 limits: ConnectionLimits | None = None) -> None:
        self.decoder = FrameDecoder(max_frame_bytes)
        self.transport: asyncio.Transport | None = None
        self._out: list[bytes] = []  # frames of this loop pass, written in one go
        self.limits = limits
        self.held_bytes = 0  # this connection's share of ``limits.held_bytes``
        self._evicted = False

    # -- subclass hooks ----------------------------------------------------------------------

    def payload_received(self, payload: bytes) -> None:
        raise NotImplementedError

    def framing_failed(self, err: WireError) -> None:
        """The byte stream is out of sync; the connection is closed right after this (a
        server's connection has noted it in ``CLIENT_CONNECTION_ERRORS`` already)."""

    def note_error(self, kind: str, detail: object) -> None:
        """An error of this connection, if it is a server's (it has ``limits``), in the
        process's rate-limited summary of client connection errors: never a line per
        connection (``protocol.log_summary``)."""
        if self.limits is not None:
            CLIENT_CONNECTION_ERRORS.note(kind, _host_of(self.transport), detail)

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop transports are not subclasses
        if self.limits is not None and not self.limits.admit(self):
            err = OverloadedError(f"too many connections (at most {self.limits.connections_max})")
            CLIENT_CONNECTION_ERRORS.note("refused", _host_of(transport), err)
            transport.write(encode_frame(encode_error(-1, err)))
            # Half-close and read (and drop) what the client had already sent: closing with
            # unread input would reset the connection and could lose the error frame. The
            # client closes on our EOF; one that does not is cut off after REFUSED_LINGER_S.
            transport.write_eof() if transport.can_write_eof() else transport.close()
            asyncio.get_running_loop().call_later(REFUSED_LINGER_S, transport.abort)
            self._evicted = True
            return
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._evicted:
            return
        try:
            payloads = self.decoder.feed(data)
        except WireError as err:
            self.note_error("bad frame", err)
            self.framing_failed(err)
            if self.transport is not None:
                self.transport.close()
            return
        if self.limits is not None:
            held = self.decoder.buffered_bytes
            if held or self.held_bytes:  # (the usual read ends on a frame boundary: nothing)
                self.limits.hold(self, held)
                if self._evicted:
                    return
        for payload in payloads:
            self.payload_received(payload)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and not self._evicted:
            self.note_error(type(exc).__name__, exc)
        if self.limits is not None:
            self.limits.release(self)
        self.transport = None

    def evict(self) -> None:
        """Closed by the listener's budget: drop what it holds, read nothing more."""
        self._evicted = True
        self.decoder = FrameDecoder(1)  # the partial frame's memory goes now, not at close
        if self.transport is not None:
            self.transport.abort()

    # -- sending -------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    @property
    def queued_bytes(self) -> int:
        """Bytes sent and not yet taken by the peer: the transport's buffer and this turn's."""
        buffered = self.transport.get_write_buffer_size() if self.transport is not None else 0
        return buffered + sum(len(f) for f in self._out)

    def send_payload(self, payload: bytes) -> None:
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(encode_frame(payload))

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.alive:
            assert self.transport is not None
            self.transport.write(b"".join(out))


def _host_of(transport: asyncio.BaseTransport | None) -> str:
    """The peer's host of a connection ("" if unknown): errors are summed up by host."""
    name = transport.get_extra_info("peername") if transport is not None else None
    return str(name[0]) if isinstance(name, tuple) and name else ""
