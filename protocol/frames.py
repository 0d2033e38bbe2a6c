"""Framing and the payload envelope of every dledger TCP protocol (Raft peers, log clients,
broker clients, snapshot streams).

Owns:
- framing: a frame is a 4-byte big-endian unsigned length followed by that many payload bytes
  (``encode_frame``, ``FrameDecoder``);
- the payload envelope shared by all protocols: a CBOR array ``[VERSION, KIND, *fields]``
  (``encode_payload`` / ``decode_payload``). Kinds 1..15 are the Raft peer protocol
  (``dledger.network.wire``); the client-facing protocols use kinds >= 64.

Pure: no asyncio, no sockets, no clock. A malformed frame or payload raises ``WireError``
(``FrameTooLargeError`` for an oversized length prefix) saying what was wrong.
"""

from __future__ import annotations

import io
import reprlib
import struct
from typing import Any

import cbor2

from protocol.errors import FrameTooLargeError, WireError

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "FIRST_APP_KIND",
    "FRAME_HEADER_BYTES",
    "RAFT_KIND_MAX",
    "U64_MAX",
    "VERSION",
    "FrameDecoder",
    "brief",
    "decode_payload",
    "encode_frame",
    "encode_payload",
    "load_envelope",
]

VERSION = 1
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024
FRAME_HEADER_BYTES = 4
_FRAME_LENGTH_MAX = 0xFFFF_FFFF
U64_MAX = 0xFFFF_FFFF_FFFF_FFFF
RAFT_KIND_MAX = 15  # kinds 1..15: the Raft peer protocol
FIRST_APP_KIND = 64  # other protocols sharing the envelope number their kinds from here

_HEADER = struct.Struct(">I")
_pack_header = _HEADER.pack
_unpack_header_from = _HEADER.unpack_from


# --- framing ---------------------------------------------------------------------------------


def encode_frame(payload: bytes) -> bytes:
    """Length-prefix one payload (one copy: header and payload in a single bytes object)."""
    size = len(payload)
    if size == 0 or size > _FRAME_LENGTH_MAX:
        raise WireError(f"cannot frame a payload of {size} bytes")
    return _pack_header(size) + payload


class FrameDecoder:
    """Incremental frame splitter: ``feed`` any chunking of the byte stream, get whole payloads.

    After it raised, the stream is out of sync: the caller must drop the connection (a decoder
    that raised keeps raising).
    """

    __slots__ = ("_buf", "_max_frame_bytes", "_error")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if not 0 < max_frame_bytes <= _FRAME_LENGTH_MAX:
            raise ValueError(f"max_frame_bytes must be in 1..{_FRAME_LENGTH_MAX}")
        self._buf = bytearray()
        self._max_frame_bytes = max_frame_bytes
        self._error: WireError | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an incomplete frame held until more data arrives."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        """Consume ``data``; return every payload completed by it, in order."""
        if self._error is not None:
            raise self._error
        buf = self._buf
        if not buf:
            # Fast path: parse straight from the chunk; keep only an incomplete tail.
            frames, pos = self._split(data)
            if pos < len(data):
                buf += memoryview(data)[pos:]
            return frames
        buf += data
        with memoryview(buf) as view:
            frames, pos = self._split(view)
        del buf[:pos]
        return frames

    def _split(self, src: Any) -> tuple[list[bytes], int]:
        """Cut whole frames out of ``src`` (bytes or a memoryview); return them and the end."""
        frames: list[bytes] = []
        pos = 0
        end_of_data = len(src)
        max_frame_bytes = self._max_frame_bytes
        while end_of_data - pos >= FRAME_HEADER_BYTES:
            (size,) = _unpack_header_from(src, pos)
            if size > max_frame_bytes or size == 0:
                self._error = self._framing_error(size)
                raise self._error
            end = pos + FRAME_HEADER_BYTES + size
            if end > end_of_data:
                break
            frames.append(bytes(src[pos + FRAME_HEADER_BYTES : end]))
            pos = end
        return frames, pos

    def _framing_error(self, size: int) -> WireError:
        if size == 0:
            return WireError("zero-length frame")
        return FrameTooLargeError(
            f"frame of {size} bytes exceeds the maximum of {self._max_frame_bytes} bytes"
        )


# --- payload envelope ----------------------------------------------------------------------

# What cbor2 may raise on hostile input besides CBORDecodeError (semantic decoders of tags such
# as datetime, decimal or ipaddress can leak their own errors; deep nesting can recurse).
_CBOR_ERRORS = (
    cbor2.CBORError, ValueError, TypeError, LookupError, ArithmeticError, RecursionError
)


def encode_payload(kind: int, fields: list[Any]) -> bytes:
    """Encode ``[VERSION, kind, *fields]`` as CBOR (for protocols other than Raft, kind >= 64)."""
    return cbor2.dumps([VERSION, kind, *fields])


def decode_payload(payload: bytes) -> tuple[int, list[Any]]:
    """Decode and version-check an envelope; return (kind, fields after the kind)."""
    array = load_envelope(payload)
    return array[1], array[2:]


def load_envelope(payload: bytes) -> list[Any]:
    """Decode exactly one CBOR item (trailing bytes rejected) and check version and kind."""
    stream = io.BytesIO(payload)
    try:
        array = cbor2.CBORDecoder(stream).decode()
    except _CBOR_ERRORS as exc:
        raise WireError(f"undecodable CBOR payload: {exc}") from exc
    if stream.tell() != len(payload):
        raise WireError(f"{len(payload) - stream.tell()} trailing bytes after the CBOR payload")
    if type(array) is not list or len(array) < 2:
        raise WireError(f"payload must be a CBOR array [version, kind, ...], got {brief(array)}")
    version = array[0]
    if type(version) is not int or version != VERSION:
        raise WireError(f"unsupported wire version {brief(version)} (this node speaks {VERSION})")
    kind = array[1]
    if type(kind) is not int or kind < 0:
        raise WireError(f"payload kind must be a non-negative integer, got {brief(kind)}")
    return array


def brief(value: Any) -> str:
    return f"{type(value).__name__} {reprlib.repr(value)}"  # bounded, even for 16 MiB input
