"""The remoting command: one request or response of RocketMQ's remoting protocol, and its bytes.

A frame is a 4-byte big-endian length (``protocol.frames`` cuts frames the same way) followed by
the payload this module reads and writes: a 4-byte word whose high byte names the header's
serialization (``codes.JSON`` or ``codes.ROCKETMQ``) and whose low 24 bits are the header's
length, the header, then the body. The header carries ``code``, ``language``, ``version``,
``opaque`` (a response carries its request's), ``flag`` (bit 0 response, bit 1 oneway),
``remark`` and ``extFields`` (string to string). A response goes out in its request's
serialization.

Pure. A payload that is not a command raises ``RemotingFrameError`` saying why; nothing a
hostile peer sends makes it allocate more than the payload's own size.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

from protocol.errors import WireError
from protocol.remoting.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    JSON,
    LANGUAGES,
    ROCKETMQ,
    SERVER_LANGUAGE,
    SERVER_VERSION,
)

__all__ = ["HEADER_BYTES_MAX", "Command", "RemotingFrameError", "decode", "encode"]

HEADER_BYTES_MAX = 256 << 10  # a header past this is refused (a send's is a few hundred bytes)
_WORD = struct.Struct(">I")
_BINARY_FIXED = struct.Struct(">hBhii")  # code, language, version, opaque, flag
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


class RemotingFrameError(WireError):
    """A payload that is not a remoting command (bad header word, serialization, header)."""


@dataclass(slots=True)
class Command:
    """One remoting command. ``ext`` is the header's extFields, strings both sides."""

    code: int
    opaque: int = 0
    flag: int = 0
    remark: str = ""
    ext: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    language: str = SERVER_LANGUAGE
    version: int = SERVER_VERSION
    serialization: int = JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def response(self, code: int, remark: str = "", ext: dict[str, str] | None = None,
                 body: bytes = b"") -> Command:
        """The answer to this request: its opaque and serialization, the response flag."""
        return Command(code, self.opaque, FLAG_RESPONSE, remark, ext or {}, body,
                       serialization=self.serialization)


def encode(cmd: Command) -> bytes:
    """The payload of ``cmd`` (frame it with ``protocol.frames.encode_frame``)."""
    if cmd.serialization == ROCKETMQ:
        header = _binary_header(cmd)
    else:
        header = json.dumps({"code": cmd.code, "language": cmd.language, "version": cmd.version,
                             "opaque": cmd.opaque, "flag": cmd.flag, "remark": cmd.remark,
                             "extFields": cmd.ext, "serializeTypeCurrentRPC": "JSON"},
                            separators=(",", ":"), ensure_ascii=False).encode()
    return _WORD.pack((cmd.serialization << 24) | len(header)) + header + cmd.body


def decode(payload: bytes) -> Command:
    """The command in one frame's payload (RemotingFrameError if it is not one)."""
    if len(payload) < 4:
        raise RemotingFrameError(f"a payload of {len(payload)} bytes has no header word")
    (word,) = _WORD.unpack_from(payload)
    kind, header_len = word >> 24, word & 0xFFFFFF
    if header_len > len(payload) - 4:
        raise RemotingFrameError(f"header length {header_len} runs past the frame's "
                                 f"{len(payload) - 4} bytes")
    if header_len > HEADER_BYTES_MAX:
        raise RemotingFrameError(f"header of {header_len} bytes exceeds {HEADER_BYTES_MAX}")
    header = payload[4 : 4 + header_len]
    body = payload[4 + header_len :]
    if kind == JSON:
        cmd = _json_command(header)
    elif kind == ROCKETMQ:
        cmd = _binary_command(header)
    else:
        raise RemotingFrameError(f"unknown header serialization {kind} (0 JSON, 1 ROCKETMQ)")
    cmd.body = body
    return cmd


# -- JSON ----------------------------------------------------------------------------------------


def _json_command(header: bytes) -> Command:
    try:
        obj = json.loads(header)
    except (ValueError, RecursionError) as err:
        raise RemotingFrameError(f"the JSON header does not parse: {err}") from err
    if not isinstance(obj, dict):
        raise RemotingFrameError("the JSON header is not an object")
    ext = obj.get("extFields") or {}
    if not isinstance(ext, dict):
        raise RemotingFrameError("extFields is not an object")
    remark = obj.get("remark")
    return Command(code=_int32(obj.get("code"), "code"), opaque=_int32(obj.get("opaque", 0), "opaque"),
                   flag=_int32(obj.get("flag", 0), "flag"),
                   remark=_utf8(remark) if isinstance(remark, str) else "",
                   ext={_utf8(str(k)): _text(v) for k, v in ext.items() if v is not None},
                   language=str(obj.get("language", "OTHER"))[:16],
                   version=_int32(obj.get("version", 0), "version"), serialization=JSON)


def _int32(value: object, what: str) -> int:
    if isinstance(value, str) and value.lstrip("-").isascii() and value.lstrip("-").isdigit() \
            and len(value) <= 11:
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not _INT32_MIN <= value <= _INT32_MAX:
        raise RemotingFrameError(f"{what} must be a 32-bit integer, not {value!r:.40}")
    return value


def _text(value: object) -> str:
    """An extFields value as a string (Java clients send strings, the C++ client numbers too);
    a string that is no UTF-8 (a lone surrogate from a ``\\ud800`` escape) is refused."""
    if isinstance(value, str):
        return _utf8(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def _utf8(text: str) -> str:
    try:
        text.encode()
    except UnicodeEncodeError as err:
        raise RemotingFrameError(f"a header string is not UTF-8: {err}") from None
    return text


# -- RocketMQ's binary form ----------------------------------------------------------------------


def _binary_header(cmd: Command) -> bytes:
    remark = cmd.remark.encode()
    fields = bytearray()
    for k, v in cmd.ext.items():
        kb, vb = k.encode(), v.encode()
        fields += struct.pack(">H", len(kb)) + kb + _WORD.pack(len(vb)) + vb
    language = LANGUAGES.index(cmd.language) if cmd.language in LANGUAGES else LANGUAGES.index("OTHER")
    return (_BINARY_FIXED.pack(cmd.code, language, cmd.version, cmd.opaque, cmd.flag)
            + _WORD.pack(len(remark)) + remark + _WORD.pack(len(fields)) + bytes(fields))


def _binary_command(header: bytes) -> Command:
    view = _Reader(header)
    code, language, version, opaque, flag = view.fixed()
    remark = view.text(view.u32(), "remark")
    fields_len = view.u32()
    end = view.pos + fields_len
    if end > len(header):
        raise RemotingFrameError(f"extFields of {fields_len} bytes run past the header")
    ext: dict[str, str] = {}
    while view.pos < end:
        key = view.text(view.u16(), "an extFields name")
        ext[key] = view.text(view.u32(), "an extFields value")
    if view.pos != end:
        raise RemotingFrameError("extFields overrun their declared length")
    return Command(code, opaque, flag, remark, ext,
                   language=LANGUAGES[language] if language < len(LANGUAGES) else "OTHER",
                   version=version, serialization=ROCKETMQ)


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def _take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise RemotingFrameError(f"{what} runs past the header")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def fixed(self) -> tuple[int, int, int, int, int]:
        values: tuple[int, int, int, int, int] = _BINARY_FIXED.unpack(
            self._take(_BINARY_FIXED.size, "the fixed header"))
        return values

    def u16(self) -> int:
        (n,) = struct.unpack(">H", self._take(2, "a length"))
        return int(n)

    def u32(self) -> int:
        (n,) = _WORD.unpack(self._take(4, "a length"))
        return int(n)

    def text(self, n: int, what: str) -> str:
        raw = self._take(n, what)
        try:
            return raw.decode()
        except UnicodeDecodeError as err:
            raise RemotingFrameError(f"{what} is not UTF-8") from err
