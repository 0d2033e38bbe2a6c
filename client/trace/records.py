"""Message trace records (RocketMQ's msgTrace): what a tracing producer or consumer writes to the
trace topic (``RMQ_SYS_TRACE_TOPIC``) about each message it sends or consumes, the codec of a
record (one JSON object per trace message, strictly checked on decode: a trace topic anyone may
write to holds garbage too), the trace message that carries it (keyed by the traced message's
unique key and offset msg id, so that the key index finds it), and the formatter of a message's
life: its send, then each consumer group's attempts in time order.

Pure: no I/O, no clock (times are in the records); the writer is ``client.trace.tracer``.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any

from client.types import Message
from protocol.topics import TRACE_TOPIC

CODEC_VERSION = 1
SEND = "send"
CONSUME = "consume"
KINDS = (SEND, CONSUME)
# A consume attempt's status: the listener answered SUCCESS, or LATER (also SUSPEND, None), or
# it raised or did not answer in time. A lite pull consumer's poll is a success.
CONSUME_STATUSES = ("success", "later", "exception")
MAX_RECORD_BYTES = 64 << 10  # a record is a few hundred bytes; anything larger is not one
MAX_TEXT_CHARS = 4096  # per string field
MAX_KEYS = 64

__all__ = ["CONSUME", "SEND", "TRACE_TOPIC", "TraceRecord", "TraceRecordError", "decode_record",
           "encode_record", "format_life", "trace_message"]


class TraceRecordError(ValueError):
    """A trace message's body is not a trace record of this version (the message says why)."""


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One send or one consume attempt of one message.

    ``time_ms``: when it began (ms since the epoch, the client's clock); ``cost_ms``: how long
    the send took to be acknowledged, or the listener to answer. ``status``: a send's
    ``SEND_OK`` or the name of the error it failed with; a consume's one of CONSUME_STATUSES.
    ``topic``: the topic the message was sent to (a retry's original topic); ``queue_topic``
    the one it was read from when that differs (``%RETRY%<group>``). ``group`` and
    ``client_id``: the producer group (empty without one) or the consumer group, and the
    client. A failed send has no unique key or offset msg id (the broker stored nothing)."""

    kind: str
    time_ms: int
    cost_ms: int
    status: str
    topic: str
    unique_key: str = ""
    offset_msg_id: str = ""
    broker_group: str = ""
    queue_id: int = -1
    queue_offset: int = -1
    keys: tuple[str, ...] = ()
    tags: str = ""
    group: str = ""
    client_id: str = ""
    reconsume_times: int = 0
    queue_topic: str = ""


_INT_FIELDS = frozenset({"time_ms", "cost_ms", "queue_id", "queue_offset", "reconsume_times"})
_FIELDS = tuple(f.name for f in fields(TraceRecord))
_REQUIRED = frozenset({"kind", "time_ms", "cost_ms", "status", "topic"})


def encode_record(record: TraceRecord) -> bytes:
    out: dict[str, Any] = {"v": CODEC_VERSION, **asdict(record)}
    out["keys"] = list(record.keys)
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode()


def decode_record(body: bytes) -> TraceRecord:
    """The record in a trace message's body; ``TraceRecordError`` for anything else (not JSON,
    another version, a field missing or of the wrong type or out of range). Unknown fields are
    ignored (a later version may add some)."""
    if type(body) is not bytes:
        raise TraceRecordError(f"a trace record is bytes, not {type(body).__name__}")
    if len(body) > MAX_RECORD_BYTES:
        raise TraceRecordError(f"{len(body)} bytes is larger than a trace record can be")
    try:
        raw = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise TraceRecordError(f"not a JSON trace record: {err}") from None
    if type(raw) is not dict or raw.get("v") != CODEC_VERSION or type(raw.get("v")) is not int:
        raise TraceRecordError("not a trace record of version 1")
    missing = sorted(_REQUIRED - raw.keys())
    if missing:
        raise TraceRecordError(f"a trace record needs {', '.join(missing)}")
    values = {name: _field(name, raw[name]) for name in _FIELDS if name in raw}
    record = TraceRecord(**values)
    if record.kind not in KINDS:
        raise TraceRecordError(f"kind is one of {', '.join(KINDS)}, not {record.kind!r}")
    if record.kind == CONSUME and record.status not in CONSUME_STATUSES:
        raise TraceRecordError(f"a consume's status is one of {', '.join(CONSUME_STATUSES)}, "
                               f"not {record.status!r}")
    return record


def _field(name: str, value: Any) -> Any:
    if name in _INT_FIELDS:
        if type(value) is not int or not -1 <= value < 2**63:
            raise TraceRecordError(f"{name} must be an integer, not {value!r:.40}")
        return value
    if name == "keys":
        if type(value) is not list or len(value) > MAX_KEYS or not all(
                type(k) is str and len(k) <= MAX_TEXT_CHARS for k in value):
            raise TraceRecordError(f"keys must be a list of at most {MAX_KEYS} strings")
        return tuple(value)
    if type(value) is not str or len(value) > MAX_TEXT_CHARS:
        raise TraceRecordError(f"{name} must be a string of at most {MAX_TEXT_CHARS} characters")
    return value


def trace_message(record: TraceRecord) -> Message:
    """The trace message carrying ``record``: tagged by its kind, keyed by the traced message's
    unique key and offset msg id (those it has)."""
    keys = [k for k in (record.unique_key, record.offset_msg_id) if k]
    return Message(TRACE_TOPIC, encode_record(record), tags=record.kind, keys=keys)


# -- a message's life ----------------------------------------------------------------------------

def format_life(records: Iterable[TraceRecord], tz: datetime.tzinfo | None = None) -> str:
    """A message's life as text: a header naming it, its sends in time order, then each
    consumer group (in the order of its first attempt) with its attempts in time order.
    ``tz``: the time zone of the times shown (default: local time)."""
    recs = sorted(set(records), key=lambda r: (r.time_ms, r.kind != SEND, r.group, r.client_id))
    if not recs:
        return "no trace records"
    sends = [r for r in recs if r.kind == SEND]
    first = sends[0] if sends else recs[0]
    lines = [_header(first, recs)]
    for r in sends:
        where = f"{r.broker_group}/{r.queue_id} offset {r.queue_offset}" if r.broker_group else ""
        lines.append(f"  send     {_when(r.time_ms, tz)}  {r.status:<10} {r.cost_ms:>6} ms  "
                     f"{r.topic} {where}".rstrip()
                     + f"  by producer {r.group or '-'} (client {r.client_id or '-'})")
    if not sends:
        lines.append("  send     (no send record: the producer did not trace it)")
    groups: dict[str, list[TraceRecord]] = {}
    for r in recs:
        if r.kind == CONSUME:
            groups.setdefault(r.group, []).append(r)
    for group, attempts in groups.items():
        lines.append(f"  consumer group {group}: {len(attempts)} attempt(s)")
        for r in attempts:
            read = f"{r.queue_topic or r.topic} {r.broker_group}/{r.queue_id} offset {r.queue_offset}"
            lines.append(f"    consume  {_when(r.time_ms, tz)}  {r.status:<10} {r.cost_ms:>6} ms  "
                         f"client {r.client_id or '-'}  reconsume {r.reconsume_times}  from {read}")
    if not groups:
        lines.append("  (no consume record: not consumed yet, or by no tracing consumer)")
    return "\n".join(lines)


def _header(first: TraceRecord, recs: list[TraceRecord]) -> str:
    offset_id = next((r.offset_msg_id for r in recs if r.kind == SEND and r.offset_msg_id),
                     first.offset_msg_id)
    unique_key = next((r.unique_key for r in recs if r.unique_key), "")
    parts = [f"message {unique_key or '?'}", f"offset msg id {offset_id or '?'}",
             f"topic {first.topic}"]
    if first.tags:
        parts.append(f"tags {first.tags}")
    if first.keys:
        parts.append(f"keys {' '.join(first.keys)}")
    return ", ".join(parts)


def _when(time_ms: int, tz: datetime.tzinfo | None) -> str:
    when = datetime.datetime.fromtimestamp(time_ms / 1000, tz or datetime.UTC)
    if tz is None:
        when = when.astimezone()  # local time
    return when.isoformat(sep=" ", timespec="milliseconds")
