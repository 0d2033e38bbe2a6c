"""Bad input at a log server's client port gets a named error and loses nothing: wrong types,
oversized proposals, unknown kinds, garbage frames. One real server process group."""

from __future__ import annotations

import asyncio
import socket
import struct
from pathlib import Path

import pytest

from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from protocol.envelope import (
    MAX_PROPOSAL_BYTES,
    PROPOSE,
    READ,
    BadRequestError,
    decode_response,
    encode_request,
)
from protocol.errors import WireError
from protocol.frames import FrameDecoder, encode_frame, encode_payload

pytestmark = pytest.mark.slow


def _raw_roundtrip(addr: tuple[str, int], frame: bytes, timeout_s: float = 5.0) -> bytes | None:
    """Send raw bytes; return the first response payload, or None if the server closed."""
    with socket.create_connection(addr, timeout=timeout_s) as s:
        s.sendall(frame)
        dec = FrameDecoder(1 << 20)
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return None
            got = dec.feed(chunk)
            if got:
                return got[0]


def test_bad_requests_get_named_errors_and_nothing_is_lost(tmp_path: Path) -> None:
    async def run(cluster: LocalCluster) -> None:
        async with LogClient(cluster.client_addresses) as client:
            leader = await client.wait_for_leader(20)
            _, first = await client.propose(b"before")
            with pytest.raises(BadRequestError, match="must be bytes"):
                await client.call(leader, PROPOSE, "a string")
            with pytest.raises(BadRequestError, match="exceeds"):
                await client.call(leader, PROPOSE, b"x" * (MAX_PROPOSAL_BYTES + 1))
            with pytest.raises(BadRequestError):  # wrong arity
                await client.call(leader, READ, 1)
            addr = cluster.servers[leader].client_address
            # an unknown request kind: a named error, the connection stays usable
            resp = decode_response(_raw_roundtrip(addr, encode_frame(encode_payload(99, [7]))))
            assert not resp.ok and resp.code == "BAD_REQUEST"
            # garbage instead of CBOR: a named error for that frame
            resp = decode_response(_raw_roundtrip(addr, encode_frame(b"\xff\xfe garbage")))
            assert not resp.ok and resp.code == "BAD_REQUEST"
            # a length prefix over the maximum frame size: the server closes that connection
            assert _raw_roundtrip(addr, struct.pack(">I", 1 << 30) + b"xx") is None
            # and it still serves everyone else; what was committed is still there
            _, after = await client.propose(b"after")
            assert after.index > first.index
            entries = await client.read(leader, first.index, 10)
            assert [e.data for e in entries if e.data in (b"before", b"after")] == [b"before", b"after"]

    with LocalCluster(str(tmp_path), size=3, tick_ms=50) as cluster:
        asyncio.run(run(cluster))


def test_request_codec_rejects_malformed_payloads() -> None:
    from protocol.envelope import decode_request
    with pytest.raises(WireError):
        decode_request(encode_payload(PROPOSE, []))  # no request id
    with pytest.raises(WireError):
        decode_request(encode_payload(PROPOSE, [True, b"x"]))  # a bool is not an id
    req = decode_request(encode_request(PROPOSE, 5, b"x"))
    assert (req.kind, req.request_id, req.args) == (PROPOSE, 5, [b"x"])
    assert BadRequestError("x").args == ("x",)
