"""The web console's input rules and derived numbers, pure (no I/O, no clock: callers pass
``now_s``): every field of an action's JSON body or of a search's query string checked, each
failure a ``BadRequestError`` naming the field; the message rate of a queue derived from
successive max-offset samples (``RateTracker``); a stored message as JSON.

The cluster's own rules are reused, not restated: topic names and queue counts are the broker's
(``protocol.topics``), node and group ids the NameServer's (``namesrv.model``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from client import FoundMessage, ReceivedMessage
from namesrv.errors import BadRequestError
from namesrv.model import ID_MAX_CHARS
from protocol.broker_errors import InvalidTopicError
from protocol.broker_kinds import INT_MAX, parse_offset_msg_id
from protocol.topics import MAX_QUEUES, PERM_READ, PERM_RW, PERM_WRITE, validate_topic_name

__all__ = ["BODY_SHOWN_BYTES", "ConsumeDirectlyAction", "MessageSearch", "RateTracker",
           "ResetAction", "TopicAction", "TransferAction", "body_text", "message_json",
           "parse_consume_directly", "parse_reset", "parse_search", "parse_topic_action",
           "parse_transfer"]

PERMS = (PERM_WRITE, PERM_READ, PERM_RW)
CONSUMER_GROUP_MAX_CHARS = 255  # the broker's bound on a consumer group name
CLIENT_ID_MAX_CHARS = 255  # and on a client id (broker.features.clients)
_CONSUMER_GROUP = re.compile(r"^[%|A-Za-z0-9_.-]+$")
_ID = re.compile(r"^[A-Za-z0-9_.-]+$")
SEARCH_COUNT_MAX = 64  # messages one search by offset shows
BODY_SHOWN_BYTES = 4096  # of a longer body, the first this many bytes (and its size)
RATE_SAMPLE_MIN_S = 0.5  # two samples closer than this give no new rate (noise)
RATE_SAMPLE_MAX_AGE_S = 300.0  # an older sample starts over: no rate averaged over hours
RATE_KEYS_MAX = 100_000


@dataclass(frozen=True, slots=True)
class TopicAction:
    """Create (every field given) or update (only what is given changes) a topic."""

    mode: str  # "create" or "update"
    name: str
    read_queues: int | None
    write_queues: int | None
    perm: int | None
    groups: tuple[str, ...]  # broker groups; empty: every registered group


@dataclass(frozen=True, slots=True)
class TransferAction:
    group: str
    to: str


@dataclass(frozen=True, slots=True)
class ResetAction:
    consumer_group: str
    topic: str
    to: str  # "earliest", "latest" or "timestamp"
    timestamp_ms: int
    force: bool


@dataclass(frozen=True, slots=True)
class ConsumeDirectlyAction:
    """One consumer consumes one stored message once more (RocketMQ's CONSUME_MESSAGE_DIRECTLY)."""

    consumer_group: str
    client_id: str
    offset_msg_id: str


@dataclass(frozen=True, slots=True)
class MessageSearch:
    """One of: ``by`` "offset" (topic, broker_group, queue_id, offset, count), "msg_id"
    (msg_id: an offset msg id), "unique_key" (msg_id; topic optional), "key" (topic, key,
    begin_ms, end_ms)."""

    by: str
    topic: str = ""
    broker_group: str = ""
    queue_id: int = 0
    offset: int = 0
    count: int = 16
    msg_id: str = ""
    key: str = ""
    begin_ms: int = 0
    end_ms: int | None = None


def _object(body: object, fields: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequestError(f"the body must be a JSON object, not {type(body).__name__}")
    unknown = sorted(set(body) - fields)
    if unknown:
        raise BadRequestError(f"unknown field(s) {', '.join(unknown)} (known: "
                              f"{', '.join(sorted(fields))})")
    return body


def _int(obj: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadRequestError(f"{key} must be an integer {lo}..{hi}, not {value!r}")
    return value


def _optional_int(obj: Mapping[str, Any], key: str, lo: int, hi: int) -> int | None:
    return None if obj.get(key) is None else _int(obj, key, lo, hi)


def _id(value: object, key: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= ID_MAX_CHARS or not _ID.match(value):
        raise BadRequestError(f"{key} must be 1..{ID_MAX_CHARS} letters, digits, '_', '.' or "
                              f"'-', not {value!r}")
    return value


def _topic(value: object, key: str = "topic", allow_system: bool = True) -> str:
    try:
        return validate_topic_name(value, allow_system=allow_system)
    except InvalidTopicError as exc:
        raise BadRequestError(f"{key}: {exc}") from exc


def _consumer_group(value: object, key: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= CONSUMER_GROUP_MAX_CHARS \
            or not _CONSUMER_GROUP.match(value):
        raise BadRequestError(f"{key} must be 1..{CONSUMER_GROUP_MAX_CHARS} letters, digits, "
                              f"'%', '|', '_', '.' or '-', not {value!r}")
    return value


def _required(obj: Mapping[str, Any], *keys: str) -> None:
    missing = [k for k in keys if obj.get(k) in (None, "")]
    if missing:
        raise BadRequestError(f"missing field(s) {', '.join(missing)}")


def parse_topic_action(body: object) -> TopicAction:
    obj = _object(body, {"mode", "name", "queues", "read_queues", "write_queues", "perm",
                         "groups"})
    _required(obj, "mode", "name")
    mode = obj["mode"]
    if mode not in ("create", "update"):
        raise BadRequestError(f"mode must be \"create\" or \"update\", not {mode!r}")
    name = _topic(obj["name"], "name", allow_system=False)
    queues = _optional_int(obj, "queues", 1 if mode == "create" else 0, MAX_QUEUES)
    reads = _optional_int(obj, "read_queues", 0, MAX_QUEUES)
    writes = _optional_int(obj, "write_queues", 0, MAX_QUEUES)
    perm = obj.get("perm")
    if perm is not None and (isinstance(perm, bool) or perm not in PERMS):
        raise BadRequestError(f"perm must be 2 (write), 4 (read) or 6 (both), not {perm!r}")
    groups = obj.get("groups") or []
    if not isinstance(groups, list) or len(groups) > 64:
        raise BadRequestError("groups must be a list of at most 64 broker group names")
    reads = queues if reads is None else reads
    writes = queues if writes is None else writes
    if mode == "create":
        if reads is None or writes is None:
            raise BadRequestError("missing field queues (1..1024): a new topic needs its queue "
                                  "count")
        perm = PERM_RW if perm is None else perm
    elif reads is None and writes is None and perm is None:
        raise BadRequestError("nothing to change: give queues, read_queues, write_queues or perm")
    return TopicAction(mode, name, reads, writes, perm,
                       tuple(sorted({_id(g, "groups[]") for g in groups})))


def parse_transfer(body: object) -> TransferAction:
    obj = _object(body, {"group", "to"})
    _required(obj, "group", "to")
    return TransferAction(_id(obj["group"], "group"), _id(obj["to"], "to"))


def parse_reset(body: object) -> ResetAction:
    obj = _object(body, {"consumer_group", "topic", "to", "timestamp_ms", "force"})
    _required(obj, "consumer_group", "topic", "to")
    to = obj["to"]
    if to not in ("earliest", "latest", "timestamp"):
        raise BadRequestError(f"to must be \"earliest\", \"latest\" or \"timestamp\", not {to!r}")
    if to == "timestamp":
        _required(obj, "timestamp_ms")
        timestamp_ms = _int(obj, "timestamp_ms", 0, INT_MAX)
    elif obj.get("timestamp_ms") is not None:
        raise BadRequestError(f"timestamp_ms goes with to=\"timestamp\", not to={to!r}")
    else:
        timestamp_ms = 0
    force = obj.get("force", False)
    if not isinstance(force, bool):
        raise BadRequestError(f"force must be true or false, not {force!r}")
    return ResetAction(_consumer_group(obj["consumer_group"], "consumer_group"),
                       _topic(obj["topic"]), to, timestamp_ms, force)


def parse_consume_directly(body: object) -> ConsumeDirectlyAction:
    obj = _object(body, {"consumer_group", "client_id", "offset_msg_id"})
    _required(obj, "consumer_group", "client_id", "offset_msg_id")
    client_id = obj["client_id"]
    if not isinstance(client_id, str) or not 0 < len(client_id) <= CLIENT_ID_MAX_CHARS \
            or not client_id.isprintable():
        raise BadRequestError(f"client_id must be 1..{CLIENT_ID_MAX_CHARS} printable "
                              f"characters, not {client_id!r}")
    offset_msg_id = obj["offset_msg_id"]
    try:
        parse_offset_msg_id(offset_msg_id if isinstance(offset_msg_id, str) else "")
    except ValueError as err:
        raise BadRequestError(f"offset_msg_id {err}") from None
    return ConsumeDirectlyAction(_consumer_group(obj["consumer_group"], "consumer_group"),
                                 client_id, offset_msg_id)


def _query_int(query: Mapping[str, str], key: str, lo: int, hi: int, default: int) -> int:
    text = query.get(key, "").strip()
    if not text:
        return default
    if not text.isdigit() or not lo <= int(text) <= hi:
        raise BadRequestError(f"{key} must be an integer {lo}..{hi}, not {text!r}")
    return int(text)


def parse_search(query: Mapping[str, str]) -> MessageSearch:
    """A search from a query string: ``msg_id`` alone (an offset msg id), ``unique_key`` [+
    ``topic``], ``topic`` + ``key`` [+ ``begin_ms``/``end_ms``], or ``topic`` + ``queue``
    ("GROUP/QUEUE_ID") + ``offset`` [+ ``count``]."""
    known = {"msg_id", "unique_key", "topic", "key", "begin_ms", "end_ms", "queue", "offset",
             "count"}
    unknown = sorted(set(query) - known)
    if unknown:
        raise BadRequestError(f"unknown parameter(s) {', '.join(unknown)}")
    q = {k: v.strip() for k, v in query.items() if v.strip()}
    if len(q.get("msg_id", "") + q.get("unique_key", "") + q.get("key", "")) > 1024:
        raise BadRequestError("msg_id, unique_key and key are at most 1024 characters")
    if "msg_id" in q:
        if set(q) != {"msg_id"}:
            raise BadRequestError("msg_id (an offset msg id) goes alone")
        return MessageSearch("msg_id", msg_id=q["msg_id"])
    if "unique_key" in q:
        if set(q) - {"unique_key", "topic"}:
            raise BadRequestError("unique_key goes alone or with topic")
        topic = _topic(q["topic"]) if "topic" in q else ""
        return MessageSearch("unique_key", topic=topic, msg_id=q["unique_key"])
    if "topic" not in q:
        raise BadRequestError("give msg_id, unique_key, topic + key, or topic + queue + offset")
    topic = _topic(q["topic"])
    if "key" in q:
        end = _query_int(q, "end_ms", 0, INT_MAX, -1)
        begin = _query_int(q, "begin_ms", 0, INT_MAX, 0)
        if 0 <= end < begin:
            raise BadRequestError(f"begin_ms ({begin}) is after end_ms ({end})")
        return MessageSearch("key", topic=topic, key=q["key"], begin_ms=begin,
                             end_ms=None if end < 0 else end)
    if "queue" not in q:
        raise BadRequestError("with topic, give key, or queue (GROUP/QUEUE_ID) and offset")
    group, sep, qid = q["queue"].partition("/")
    if not sep or not qid.isdigit() or not int(qid) < MAX_QUEUES:
        raise BadRequestError(f"queue must be GROUP/QUEUE_ID (queue id 0..{MAX_QUEUES - 1}), "
                              f"not {q['queue']!r}")
    return MessageSearch("offset", topic=topic, broker_group=_id(group, "queue's group"),
                         queue_id=int(qid), offset=_query_int(q, "offset", 0, INT_MAX, 0),
                         count=_query_int(q, "count", 1, SEARCH_COUNT_MAX, 16))


class RateTracker:
    """Messages per second of each key (a queue), from the max offsets it is shown: the
    difference of two samples over the time between them. The first sample has no rate
    (None); samples closer than ``RATE_SAMPLE_MIN_S`` repeat the last rate. Bounded: at most
    ``RATE_KEYS_MAX`` keys, the least recently sampled dropped first."""

    def __init__(self, keys_max: int = RATE_KEYS_MAX) -> None:
        self.keys_max = keys_max
        self._samples: dict[object, tuple[float, int, float | None]] = {}

    def sample(self, key: object, max_offset: int, now_s: float) -> float | None:
        held = self._samples.pop(key, None)
        if held is not None:
            at_s, seen, rate = held
            if 0 <= now_s - at_s < RATE_SAMPLE_MIN_S:
                self._samples[key] = held
                return rate
            if now_s - at_s <= RATE_SAMPLE_MAX_AGE_S and max_offset >= seen:
                rate = (max_offset - seen) / (now_s - at_s)
                self._samples[key] = (now_s, max_offset, rate)
                return rate
        self._samples[key] = (now_s, max_offset, None)
        while len(self._samples) > self.keys_max:
            del self._samples[next(iter(self._samples))]
        return None


def body_text(body: bytes) -> tuple[str, str]:
    """(encoding, text): ("utf-8", the text) when printable UTF-8, else ("hex", hex digits)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "hex", body.hex()
    if all(c.isprintable() or c in "\n\t\r" for c in text):
        return "utf-8", text
    return "hex", body.hex()


def message_json(m: FoundMessage | ReceivedMessage) -> dict[str, Any]:
    """A message found by a query or read by a pull, for the page (body cut at
    ``BODY_SHOWN_BYTES``)."""
    if isinstance(m, FoundMessage):
        where = {"group": m.group, "topic": m.topic, "queue_id": m.queue_id,
                 "msg_id": m.unique_key, "consumed_by": list(m.consumed_by)}
    else:
        where = {"group": m.queue.group, "topic": m.queue.topic, "queue_id": m.queue.queue_id,
                 "msg_id": m.msg_id, "consumed_by": None}
    encoding, text = body_text(m.body[:BODY_SHOWN_BYTES])
    return {**where, "offset_msg_id": m.offset_msg_id, "queue_offset": m.queue_offset,
            "tags": m.tags, "keys": list(m.keys), "properties": dict(m.properties),
            "born_ts_ms": m.born_ts_ms, "store_ts_ms": m.store_ts_ms,
            "body_bytes": len(m.body), "body_encoding": encoding, "body": text,
            "body_cut": len(m.body) > BODY_SHOWN_BYTES}
