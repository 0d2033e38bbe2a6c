"""What a 4.x client reads and writes about messages: the property string, the stored-message
record a pull answers with, a batch send's body, and the two message ids.

- Properties travel as one string, ``name\\x01value\\x02`` per property. The broker's message
  fields ``tags``, ``keys`` and ``unique_key`` are the properties ``TAGS``, ``KEYS`` (space
  separated) and ``UNIQ_KEY`` there (``split_properties`` / ``join_properties``).
- A stored message (RocketMQ's MessageExt record, magic ``MAGIC_V1``): size, magic, body CRC,
  queue id, flag, queue offset, commitlog offset, sys flag, born time and host, store time and
  host, reconsume times, prepared-transaction offset, then the body, the topic (1-byte length)
  and the properties (2-byte length); integers big-endian, hosts IPv4 + port.
- A batch send's body: per message its size, magic, body CRC, flag, body and properties.
- A message's ``offsetMsgId`` is 32 hex digits: the store host's IPv4 address and port and a
  commitlog offset. dledger's own id (``protocol.broker_kinds.offset_msg_id``: group, position,
  slot) maps to the offset ``position << SLOT_BITS | slot`` at the node's remoting address, so
  the id a 4.x client holds leads back to the node and the message (``commitlog_offset``).

Pure. A malformed batch raises ``RecordError`` naming what is wrong.
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "KEYS",
    "MAGIC_V1",
    "SLOT_BITS",
    "TAGS",
    "UNIQ_KEY",
    "BatchMessage",
    "RecordError",
    "StoredRecord",
    "commitlog_offset",
    "decode_batch",
    "decode_records",
    "encode_batch",
    "encode_record",
    "join_properties",
    "offset_msg_id_4x",
    "parse_offset_msg_id_4x",
    "split_properties",
]

TAGS, KEYS, UNIQ_KEY = "TAGS", "KEYS", "UNIQ_KEY"
NAME_VALUE, SEPARATOR = "\x01", "\x02"
MAGIC_V1 = 0xDAA320A7 - (1 << 32)  # RocketMQ's MESSAGE_MAGIC_CODE, a signed int
SLOT_BITS = 20  # a message's slot in its log entry: below this bit of the commitlog offset
SYSFLAG_COMPRESSED = 1
_BATCH_HEAD = struct.Struct(">iiiii")  # size, magic, body crc, flag, body length
_RECORD_HEAD = struct.Struct(">iiiiiqqiq4siq4siiq")


class RecordError(ValueError):
    """A batch body or message id that is not one (what and where)."""


def split_properties(text: str) -> tuple[str, list[str], str, list[list[str]]]:
    """(tags, keys, unique key, the other properties in order) of a property string."""
    tags, keys, unique = "", [], ""
    rest: list[list[str]] = []
    for item in text.split(SEPARATOR):
        if not item:
            continue
        name, sep, value = item.partition(NAME_VALUE)
        if not sep:
            continue  # RocketMQ drops a property without a value the same way
        if name == TAGS:
            tags = value
        elif name == KEYS:
            keys = [k for k in value.split(" ") if k]
        elif name == UNIQ_KEY:
            unique = value
        else:
            rest.append([name, value])
    return tags, keys, unique, rest


def join_properties(tags: str, keys: Sequence[str], unique_key: str,
                    properties: Iterable[Sequence[str]]) -> str:
    """The property string of a message's fields (``split_properties`` reversed)."""
    parts = []
    if tags:
        parts.append(f"{TAGS}{NAME_VALUE}{tags}{SEPARATOR}")
    if keys:
        parts.append(f"{KEYS}{NAME_VALUE}{' '.join(keys)}{SEPARATOR}")
    if unique_key:
        parts.append(f"{UNIQ_KEY}{NAME_VALUE}{unique_key}{SEPARATOR}")
    for name, value in properties:
        parts.append(f"{name}{NAME_VALUE}{value}{SEPARATOR}")
    return "".join(parts)


def body_crc(body: bytes) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


@dataclass(frozen=True, slots=True)
class BatchMessage:
    flag: int
    body: bytes
    properties: str


def decode_batch(data: bytes) -> list[BatchMessage]:
    """The messages of a batch send's body (RecordError if it is not one)."""
    out: list[BatchMessage] = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < _BATCH_HEAD.size:
            raise RecordError(f"message {len(out)} of the batch is cut short at byte {pos}")
        size, _, _, flag, body_len = _BATCH_HEAD.unpack_from(data, pos)
        end = pos + size
        if size < _BATCH_HEAD.size + 2 or end > len(data) or body_len < 0 \
                or pos + _BATCH_HEAD.size + body_len + 2 > end:
            raise RecordError(f"message {len(out)} of the batch declares a size ({size}) or "
                              f"body length ({body_len}) that does not fit")
        body_at = pos + _BATCH_HEAD.size
        body = data[body_at : body_at + body_len]
        (props_len,) = struct.unpack_from(">h", data, body_at + body_len)
        props_at = body_at + body_len + 2
        if props_len < 0 or props_at + props_len != end:
            raise RecordError(f"message {len(out)} of the batch: properties of {props_len} "
                              f"bytes do not end where its size says")
        try:
            props = data[props_at:end].decode()
        except UnicodeDecodeError as err:
            raise RecordError(f"message {len(out)} of the batch: properties not UTF-8") from err
        out.append(BatchMessage(flag, body, props))
        pos = end
    return out


def encode_batch(messages: Iterable[BatchMessage]) -> bytes:
    """A batch send's body (``decode_batch`` reversed)."""
    out = []
    for m in messages:
        props = m.properties.encode()
        out.append(_BATCH_HEAD.pack(_BATCH_HEAD.size + len(m.body) + 2 + len(props), 0,
                                    body_crc(m.body), m.flag, len(m.body)))
        out += [m.body, struct.pack(">h", len(props)), props]
    return b"".join(out)


def _host(address: tuple[str, int]) -> tuple[bytes, int]:
    try:
        ip = ipaddress.ip_address(address[0])
    except ValueError:
        return b"\0\0\0\0", address[1]
    return (ip.packed if ip.version == 4 else b"\0\0\0\0"), address[1]


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """One stored message as a pull answers it."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    body: bytes
    properties: str
    born_ts_ms: int
    store_ts_ms: int
    store_host: tuple[str, int]
    born_host: tuple[str, int] = ("0.0.0.0", 0)
    reconsume_times: int = 0
    flag: int = 0
    sys_flag: int = 0


def encode_record(r: StoredRecord) -> bytes:
    """RocketMQ's MessageExt record of ``r`` (a pull's body is these, one after another)."""
    topic = r.topic.encode()[:127]
    props = r.properties.encode()[:32767]
    born_ip, born_port = _host(r.born_host)
    store_ip, store_port = _host(r.store_host)
    size = _RECORD_HEAD.size + 4 + len(r.body) + 1 + len(topic) + 2 + len(props)
    head = _RECORD_HEAD.pack(size, MAGIC_V1, body_crc(r.body), r.queue_id, r.flag,
                             r.queue_offset, r.commitlog_offset, r.sys_flag, r.born_ts_ms,
                             born_ip, born_port, r.store_ts_ms, store_ip, store_port,
                             r.reconsume_times, 0)
    return b"".join((head, struct.pack(">i", len(r.body)), r.body, bytes((len(topic),)), topic,
                     struct.pack(">h", len(props)), props))


def decode_records(data: bytes) -> list[StoredRecord]:
    """The records of a pull's body (``encode_record`` reversed; RecordError if cut short)."""
    out: list[StoredRecord] = []
    pos = 0
    try:
        while pos < len(data):
            (size, magic, _crc, queue_id, flag, queue_offset, cl_offset, sys_flag, born_ms,
             born_ip, born_port, store_ms, store_ip, store_port, reconsume,
             _prepared) = _RECORD_HEAD.unpack_from(data, pos)
            at = pos + _RECORD_HEAD.size
            (body_len,) = struct.unpack_from(">i", data, at)
            body = data[at + 4 : at + 4 + body_len]
            at += 4 + body_len
            topic_len = data[at]
            topic = data[at + 1 : at + 1 + topic_len].decode()
            at += 1 + topic_len
            (props_len,) = struct.unpack_from(">h", data, at)
            props = data[at + 2 : at + 2 + props_len].decode()
            if magic != MAGIC_V1 or at + 2 + props_len != pos + size:
                raise RecordError(f"record {len(out)}: not a version 1 record of {size} bytes")
            out.append(StoredRecord(topic, queue_id, queue_offset, cl_offset, body, props,
                                    born_ms, store_ms,
                                    (str(ipaddress.ip_address(store_ip)), store_port),
                                    (str(ipaddress.ip_address(born_ip)), born_port),
                                    reconsume, flag, sys_flag))
            pos += size
    except (struct.error, IndexError, UnicodeDecodeError) as err:
        raise RecordError(f"record {len(out)} is cut short or malformed: {err}") from err
    return out


def commitlog_offset(position: int, slot: int) -> int:
    """The commitlog offset a 4.x client sees for dledger's (position, slot)."""
    return (position << SLOT_BITS) | slot


def offset_msg_id_4x(store_host: tuple[str, int], position: int, slot: int) -> str:
    """A 4.x ``offsetMsgId``: the store host and the commitlog offset, 32 hex digits."""
    ip, port = _host(store_host)
    return (ip + struct.pack(">iq", port, commitlog_offset(position, slot))).hex().upper()


def parse_offset_msg_id_4x(text: str) -> tuple[tuple[str, int], int, int]:
    """(store host, position, slot) of a 4.x ``offsetMsgId`` (RecordError if not one)."""
    try:
        raw = bytes.fromhex(text)
    except ValueError as err:
        raise RecordError(f"not a 4.x message id (32 hex digits): {text[:40]!r}") from err
    if len(raw) != 16:
        raise RecordError(f"not a 4.x message id (32 hex digits): {text[:40]!r}")
    port, offset = struct.unpack(">iq", raw[4:])
    if offset < 0:
        raise RecordError(f"a 4.x message id with a negative offset: {text!r}")
    return ((str(ipaddress.ip_address(raw[:4])), port), offset >> SLOT_BITS,
            offset & ((1 << SLOT_BITS) - 1))
