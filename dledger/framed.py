"""An asyncio protocol base for connections that carry length-prefixed frames (``wire``):
decodes incoming frames and coalesces outgoing ones into one write per loop pass.

Owns only framing on a live connection; what the payloads mean is the subclass's business
(``server`` answers requests, ``client`` matches responses).
"""

from __future__ import annotations

import asyncio
from typing import cast

from dledger.errors import WireError
from dledger.wire import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame


class FramedProtocol(asyncio.Protocol):
    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.decoder = FrameDecoder(max_frame_bytes)
        self.transport: asyncio.Transport | None = None
        self._out: list[bytes] = []  # frames of this loop pass, written in one go

    # -- subclass hooks ----------------------------------------------------------------------

    def payload_received(self, payload: bytes) -> None:
        raise NotImplementedError

    def framing_failed(self, err: WireError) -> None:
        """The byte stream is out of sync; the connection is closed right after this."""

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop transports are not subclasses
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            payloads = self.decoder.feed(data)
        except WireError as err:
            self.framing_failed(err)
            if self.transport is not None:
                self.transport.close()
            return
        for payload in payloads:
            self.payload_received(payload)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    # -- sending -------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def send_payload(self, payload: bytes) -> None:
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(encode_frame(payload))

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.alive:
            assert self.transport is not None
            self.transport.write(b"".join(out))
