"""The inbound half of the peer transport (``dledger.network.transport``): a connection a peer
dialed, read-only. Its first frame is ``Hello(group, node_id, listen)`` (Raft traffic follows,
each message from that node to this one) or ``SnapshotHello`` (a snapshot stream follows, handed
to the owner's ``on_stream``). Before its Hello it may hold at most ``HELLO_BYTES_MAX`` of a
partial frame. Under ``--peer-mtls`` the Hello's node must be the one the dialer's certificate
names (``dledger.network.peer_identity``).

Owns one accepted connection; its owner (the transport) owns the listener, the counters and
the callbacks. Must not: interpret Raft messages, write to the connection, or let a malformed or
misnamed peer do more than close its own connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol, cast

from dledger.network.outbound import PeerStats, set_nodelay
from dledger.network.peer_identity import refusal
from dledger.network.peer_stream import PeerStream
from dledger.network.wire import Hello, SnapshotHello, decode_message
from dledger.raft.types import Message
from protocol.errors import WireError
from protocol.frames import FrameDecoder

__all__ = ["HELLO_BYTES_MAX", "UNATTRIBUTED", "InboundOwner", "InboundProtocol"]

logger = logging.getLogger("dledger.network.transport")

# stats() key for what cannot be pinned on a known peer: messages to an unknown dst, inbound
# connections that failed before (or at) their Hello.
UNATTRIBUTED = "?"
HELLO_BYTES_MAX = 4096  # what an inbound connection may buffer before its Hello arrived


class InboundOwner(Protocol):
    """What an inbound connection uses of the transport that accepted it."""

    node_id: str
    group: str
    max_frame_bytes: int
    stopped: bool
    peer_identity: bool  # --peer-mtls: a Hello's node must be the certificate's
    inbound: set[InboundProtocol]
    on_message: Callable[[Message], None]
    on_batch_end: Callable[[], None] | None
    on_stream: Callable[[PeerStream], None] | None

    def stats_of(self, peer: str) -> PeerStats: ...

    def learn_address(self, peer: str, listen: str, source: str) -> None: ...


class InboundProtocol(asyncio.Protocol):
    """An accepted connection: Hello first, then frames decoded and handed to on_message."""

    def __init__(self, owner: InboundOwner) -> None:
        self._owner = owner
        self._decoder = FrameDecoder(owner.max_frame_bytes)
        self._peer: str | None = None  # set by a valid Hello
        self._stream: PeerStream | None = None  # set by a SnapshotHello: payloads go there
        self._stats = owner.stats_of(UNATTRIBUTED)
        self._transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop transports are not subclasses
        self._transport = transport
        set_nodelay(transport)
        if self._owner.stopped:
            transport.abort()
            return
        self._owner.inbound.add(self)

    def data_received(self, data: bytes) -> None:
        self._stats.bytes_received += len(data)
        try:
            payloads = self._decoder.feed(data)
        except WireError as exc:
            self._refuse(f"bad framing: {exc}")
            return
        if self._deliver(payloads) and self._owner.on_batch_end is not None:
            self._owner.on_batch_end()
        if self._peer is None and self._decoder.buffered_bytes > HELLO_BYTES_MAX \
                and self._transport is not None and not self._transport.is_closing():
            # Who has not said Hello may not make us hold a large frame (a peer's first frame
            # is a small Hello): unidentified connections cost at most this much each.
            self._refuse(f"{self._decoder.buffered_bytes} bytes of a frame before any Hello")

    def _deliver(self, payloads: list[bytes]) -> int:
        """Decode and hand on the payloads of one read; returns how many messages went on."""
        delivered = 0
        for payload in payloads:
            if self._transport is None or self._transport.is_closing():
                break  # closed by on_message (e.g. the node stopped): deliver nothing more
            if self._stream is not None:
                self._stream.feed(payload)
                continue
            try:
                msg = decode_message(payload)
            except WireError as exc:
                self._refuse(f"bad payload: {exc}")
                break
            if self._peer is None:
                self._on_hello(msg)
            elif isinstance(msg, (Hello, SnapshotHello)) or msg.src != self._peer \
                    or msg.dst != self._owner.node_id:
                self._refuse(f"misrouted or out-of-place message {type(msg).__name__}")
            else:
                self._stats.received += 1
                self._owner.on_message(msg)
                delivered += 1
        return delivered

    def _on_hello(self, msg: Any) -> None:
        stream = type(msg) is SnapshotHello
        if type(msg) is not Hello and not stream:
            self._refuse(f"expected Hello first, got {type(msg).__name__}")
        elif msg.group != self._owner.group:
            self._refuse(f"Hello from {msg.node_id!r} of group {msg.group!r}")
        elif stream and (self._owner.on_stream is None or self._transport is None):
            self._refuse(f"{msg.node_id!r} offers a snapshot stream; this node takes none")
        elif self._owner.peer_identity and (why := refusal(self._transport, msg.group,
                                                           msg.node_id)) is not None:
            self._refuse(f"it says it is {msg.node_id!r}, but {why}")
        else:
            self._peer = msg.node_id
            self._stats = self._owner.stats_of(msg.node_id)
            if not stream and msg.listen:
                self._owner.learn_address(msg.node_id, msg.listen, self._peername())
            if stream and self._transport is not None and self._owner.on_stream is not None:
                self._stream = PeerStream(self._transport, msg.node_id)
                self._owner.on_stream(self._stream)

    def _refuse(self, why: str) -> None:
        self._stats.errors += 1
        logger.warning("closing inbound connection from %s (%s): %s",
                       self._peer or "unidentified peer", self._peername(), why)
        self.close()

    def _peername(self) -> str:
        name = self._transport.get_extra_info("peername") if self._transport else None
        return f"{name[0]}:{name[1]}" if name else "?"

    def close(self) -> None:
        if self._transport is not None:
            self._transport.abort()  # read-only link: nothing of ours to flush

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner.inbound.discard(self)
        self._transport = None
        if self._stream is not None:
            self._stream.connection_lost()
        if not self.closed.done():
            self.closed.set_result(None)
