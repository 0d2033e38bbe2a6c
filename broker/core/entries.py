"""The core's log entries: sends (one run, or several runs in one entry), topic configuration and
consumer offsets. What the leader proposes and every replica applies; each feature's entries are
in its own folder, and the registry (``broker.core.registry``) holds them all.

Everything an apply needs is inside the entry, the leader's store timestamp and its auto-create
decision included, so that replicas never consult their own clock or configuration. Decoding is
strict (``broker.core.codec``). A send's messages reach the state machine in entry form
(``StoredSend``, ``StoredRuns``: no ``Message`` object per message on the replicas' hot path).
Kinds (never renumbered): 1 SEND, 2 TOPIC_PUT, 3 TOPIC_DELETE, 4 OFFSET_COMMIT, 5 SEND_RUNS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cbor2

from broker.core.codec import (
    VERSION,
    Message,
    as_bool,
    as_int,
    as_str,
    check_message,
    dump,
    message_of,
    wire_messages,
)

__all__ = ["KIND_OFFSET_COMMIT", "KIND_SEND", "KIND_SEND_RUNS", "KIND_TOPIC_DELETE",
           "KIND_TOPIC_PUT", "Message", "OffsetCommit", "SendEntry", "SendRun", "SendRunsEntry",
           "StoredRuns", "StoredSend", "TopicDelete", "TopicPut", "decode_offset_commit",
           "decode_runs", "decode_runs_applied", "decode_send", "decode_send_applied",
           "decode_topic_delete", "decode_topic_put", "encode_offset_commit", "encode_runs",
           "encode_runs_entry", "encode_send", "encode_send_entry", "encode_topic_delete",
           "encode_topic_put", "runs_messages", "send_messages"]

KIND_SEND = 1
KIND_TOPIC_PUT = 2
KIND_TOPIC_DELETE = 3
KIND_OFFSET_COMMIT = 4
KIND_SEND_RUNS = 5


@dataclass(frozen=True, slots=True)
class SendEntry:
    """One send request (a single message or a batch), to one queue of one topic."""

    topic: str
    queue_id: int
    store_ts_ms: int  # the leader's clock when it proposed the entry
    messages: tuple[Message, ...]
    auto_create: bool = False  # the leader's decision: create the topic if it is missing
    default_queues: int = 4


@dataclass(frozen=True, slots=True)
class SendRun:
    """The messages of a multi-run entry that go to one queue of one topic, with the leader's
    auto-create decision and default queue count for that topic."""

    topic: str
    queue_id: int
    messages: tuple[Message, ...]
    auto_create: bool = False
    default_queues: int = 4


@dataclass(frozen=True, slots=True)
class SendRunsEntry:
    """Independent sends to several queues and topics of one group, stored as one entry (the
    leader's group commit). Each run is applied all or nothing on its own; a message's slot is
    its index over all the runs' messages in order."""

    store_ts_ms: int  # the leader's clock when it proposed the entry
    runs: tuple[SendRun, ...]


@dataclass(slots=True)
class StoredSend:
    """A send entry as the state machine applies it: every message checked exactly as
    ``decode_send`` checks it, but left in entry form (``[body, tags, [keys], unique_key,
    [[name, value]], born_ts_ms]``), since applying needs only sizes, tags and unique keys.
    A value, never changed once made (not frozen: one is made per run, on every replica)."""

    topic: str
    queue_id: int
    store_ts_ms: int
    messages: list[list[Any]]
    auto_create: bool
    default_queues: int


@dataclass(frozen=True, slots=True)
class StoredRuns:
    """A multi-run send entry as the state machine applies it: each run a ``StoredSend`` (with
    the entry's store time), checked exactly as ``decode_send`` checks it."""

    store_ts_ms: int
    runs: list[StoredSend]


@dataclass(frozen=True, slots=True)
class TopicPut:
    """Create a topic or update its queue counts and permission."""

    name: str
    read_queues: int
    write_queues: int
    perm: int
    system: bool = False  # the broker's own topics may use reserved names


@dataclass(frozen=True, slots=True)
class TopicDelete:
    name: str


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    """A clustering consumer group's progress on one queue (the next offset to consume)."""

    group: str
    topic: str
    queue_id: int
    offset: int


# -- sends ------------------------------------------------------------------------------------------

def encode_send(topic: str, queue_id: int, store_ts_ms: int, messages: list[list[Any]],
                auto_create: bool, default_queues: int) -> bytes:
    """A send entry from messages already in entry form ``[body, tags, [keys], unique_key,
    [[name, value]], born_ts_ms]`` (the leader's hot path: no Message objects built)."""
    return cbor2.dumps([VERSION, KIND_SEND, topic, queue_id, store_ts_ms, messages, auto_create,
                        default_queues])


def encode_runs(store_ts_ms: int, runs: list[list[Any]]) -> bytes:
    """A multi-run send entry from runs in entry form ``[topic, queue_id, [message...],
    auto_create, default_queues]``, messages as ``encode_send`` takes them."""
    return cbor2.dumps([VERSION, KIND_SEND_RUNS, store_ts_ms, runs])


def encode_send_entry(e: SendEntry) -> bytes:
    return encode_send(e.topic, e.queue_id, e.store_ts_ms, wire_messages(e.messages),
                       e.auto_create, e.default_queues)


def encode_runs_entry(e: SendRunsEntry) -> bytes:
    return encode_runs(e.store_ts_ms, [[r.topic, r.queue_id, wire_messages(r.messages),
                                        r.auto_create, r.default_queues] for r in e.runs])


def _messages(msgs: Any) -> list[Any]:
    if not isinstance(msgs, list) or not msgs:
        raise ValueError("a send carries at least one message")
    return msgs


def _runs(runs: Any) -> list[Any]:
    if not isinstance(runs, list) or not runs:
        raise ValueError("a multi-run send carries at least one run")
    return runs


def _run_fields(run: Any) -> tuple[Any, Any, Any, Any, Any]:
    if type(run) is not list:
        raise ValueError("a run must be a list")
    topic, queue_id, msgs, auto_create, default_queues = run
    return topic, queue_id, msgs, auto_create, default_queues


def decode_send(number: int, f: list[Any]) -> SendEntry:
    topic, queue_id, ts, msgs, auto_create, default_queues = f
    return SendEntry(as_str(topic), as_int(queue_id), as_int(ts),
                     tuple(message_of(m) for m in _messages(msgs)), as_bool(auto_create),
                     as_int(default_queues, 1))


def decode_runs(number: int, f: list[Any]) -> SendRunsEntry:
    ts, runs = f
    out = []
    for run in _runs(runs):
        topic, queue_id, msgs, auto_create, default_queues = _run_fields(run)
        out.append(SendRun(as_str(topic), as_int(queue_id),
                           tuple(message_of(m) for m in _messages(msgs)),
                           as_bool(auto_create), as_int(default_queues, 1)))
    return SendRunsEntry(as_int(ts), tuple(out))


def _stored_send(topic: Any, queue_id: Any, msgs: Any, auto_create: Any, default_queues: Any,
                 ts: int) -> StoredSend:
    for m in _messages(msgs):
        check_message(m)
    return StoredSend(as_str(topic), as_int(queue_id), ts, msgs, as_bool(auto_create),
                      as_int(default_queues, 1))


def decode_send_applied(number: int, f: list[Any]) -> StoredSend:
    """A send as the replicas apply it (refusing exactly what ``decode_send`` refuses)."""
    topic, queue_id, ts, msgs, auto_create, default_queues = f
    return _stored_send(topic, queue_id, msgs, auto_create, default_queues, as_int(ts))


def decode_runs_applied(number: int, f: list[Any]) -> StoredRuns:
    ts, runs = f
    ts = as_int(ts)
    return StoredRuns(ts, [_stored_send(*_run_fields(r), ts) for r in _runs(runs)])


def send_messages(f: list[Any]) -> list[Any]:
    """A stored send's messages by slot, from its fields."""
    msgs: list[Any] = f[3]
    return msgs


def runs_messages(f: list[Any]) -> list[Any]:
    """A stored multi-run send's messages by slot (counting on across its runs)."""
    return [m for run in f[1] for m in run[2]]


# -- topics and offsets -----------------------------------------------------------------------------

def encode_topic_put(e: TopicPut) -> bytes:
    return dump(KIND_TOPIC_PUT, [e.name, e.read_queues, e.write_queues, e.perm, e.system])


def decode_topic_put(number: int, f: list[Any]) -> TopicPut:
    name, r, w, perm, system = f
    return TopicPut(as_str(name), as_int(r), as_int(w), as_int(perm), as_bool(system))


def encode_topic_delete(e: TopicDelete) -> bytes:
    return dump(KIND_TOPIC_DELETE, [e.name])


def decode_topic_delete(number: int, f: list[Any]) -> TopicDelete:
    (name,) = f
    return TopicDelete(as_str(name))


def encode_offset_commit(e: OffsetCommit) -> bytes:
    return dump(KIND_OFFSET_COMMIT, [e.group, e.topic, e.queue_id, e.offset])


def decode_offset_commit(number: int, f: list[Any]) -> OffsetCommit:
    group, topic, queue_id, offset = f
    return OffsetCommit(as_str(group), as_str(topic), as_int(queue_id), as_int(offset))
