"""A bare remoting connection for the tests (``RawRemoting``): one command out, its response (by
opaque) back, with a deadline; or raw bytes out, to see what a listener does with them."""

from __future__ import annotations

import asyncio
import itertools
import struct
from typing import Any

from protocol.frames import encode_frame
from protocol.remoting.command import Command, decode, encode

TIMEOUT_S = 10.0


class RawRemoting:
    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port = host, int(port)
        self._opaque = itertools.count(1)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> RawRemoting:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self.writer is not None:
            self.writer.close()

    async def call(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"",
                   serialization: int = 0, timeout_s: float = TIMEOUT_S) -> Command:
        cmd = Command(code, next(self._opaque), ext=ext or {}, body=body,
                      serialization=serialization)
        self.send_raw(encode_frame(encode(cmd)))
        while True:
            response = await asyncio.wait_for(self.read(), timeout_s)
            if response.is_response and response.opaque == cmd.opaque:
                return response  # (the server's own requests, NOTIFY_... , are passed over)

    async def request(self, code: int, timeout_s: float = TIMEOUT_S) -> Command:
        """The next request of the server's with this code (others passed over)."""
        while True:
            cmd = await asyncio.wait_for(self.read(), timeout_s)
            if not cmd.is_response and cmd.code == code:
                return cmd

    def answer(self, request: Command, code: int, body: bytes = b"", remark: str = "") -> None:
        self.send_raw(encode_frame(encode(request.response(code, remark, body=body))))

    def send_raw(self, data: bytes) -> None:
        assert self.writer is not None
        self.writer.write(data)

    async def read(self) -> Command:
        assert self.reader is not None
        (size,) = struct.unpack(">I", await self.reader.readexactly(4))
        return decode(await self.reader.readexactly(size))

    async def closed(self, timeout_s: float = TIMEOUT_S) -> bool:
        """True once the server closed the connection (EOF) within the deadline, whatever it
        wrote first (the NameServer's HTTP side answers a stray frame with a 400)."""
        assert self.reader is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            while loop.time() < deadline:
                if not await asyncio.wait_for(self.reader.read(1 << 16),
                                              max(0.001, deadline - loop.time())):
                    return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        return False
