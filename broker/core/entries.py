"""The broker's log entries: what the leader proposes and every replica applies.

Owns the payload codec: a CBOR array ``[VERSION, KIND, ...fields]``, strictly validated on decode
(a malformed committed entry must be refused the same way on every replica, never crash one).
Everything an apply needs is inside the entry, the leader's store timestamp and its auto-create
decision included, so that replicas never consult their own clock or configuration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Union

import cbor2

from protocol.broker_errors import BadEntryError
from protocol.broker_kinds import INT_MAX

VERSION = 1
KIND_SEND = 1
KIND_TOPIC_PUT = 2
KIND_TOPIC_DELETE = 3
KIND_OFFSET_COMMIT = 4
KIND_SEND_RUNS = 5
KIND_TIMER_DELIVER = 6
KIND_LOCK_QUEUES = 7
KIND_UNLOCK_QUEUES = 8
KIND_TXN_END = 9
KIND_TXN_CHECK = 10
KIND_OFFSET_RESET = 11


@dataclass(frozen=True, slots=True)
class Message:
    body: bytes
    tags: str = ""
    keys: tuple[str, ...] = ()
    unique_key: str = ""  # RocketMQ's UNIQ_KEY, set by the client: a retried send reuses it
    properties: tuple[tuple[str, str], ...] = ()
    born_ts_ms: int = 0


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


@dataclass(frozen=True, slots=True)
class TimerDeliver:
    """The delay service's delivery of due timers (``broker.features.delay.model``): per timer its schedule
    queue offset and due time (which name it in the index), its real topic and queue, and the
    message copy to store there. A timer no longer pending is skipped at apply."""

    store_ts_ms: int  # the leader's clock when it proposed the entry: never before a due time
    items: tuple[tuple[int, int, str, int, list[Any]], ...]
    auto_create: bool = False
    default_queues: int = 4


@dataclass(frozen=True, slots=True)
class LockQueues:
    """An orderly consumer's lock (or renewal) of queues (``broker.features.orderly.model``); ``lock=False``:
    their release."""

    store_ts_ms: int
    group: str
    client_id: str
    queues: tuple[tuple[str, int], ...]
    lock: bool = True
    ttl_ms: int = 60_000


@dataclass(frozen=True, slots=True)
class TxnEnd:
    """The end of a transaction (``broker.features.txn.model``): ``decision`` COMMIT or ROLLBACK of every half
    message in ``halves`` (half-queue offsets, as the leader read the open transaction). A commit
    carries one ``[topic, queue id, message]`` copy per half for its real queue, and the consumer
    offsets to set with it (``[group, topic, queue id, expected, new]``: set only if the group's
    offset is ``expected``, -1 for none; if one is not, the transaction rolls back instead). A
    rollback after the last check-back (``check_max``) carries the copies for the check-max
    topic; another carries none."""

    store_ts_ms: int
    producer_group: str
    txn_id: str
    decision: str
    halves: tuple[int, ...]
    items: tuple[tuple[str, int, list[Any]], ...] = ()
    offsets: tuple[tuple[str, str, int, int, int], ...] = ()
    check_max: bool = False
    from_check: bool = False
    auto_create: bool = False
    default_queues: int = 4


@dataclass(frozen=True, slots=True)
class TxnCheck:
    """The leader's check-backs of open transactions: ``(txn id, its check count after this
    one)``, each counted once at apply."""

    store_ts_ms: int
    checks: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class OffsetReset:
    """An admin's reset of a consumer group's offsets on several queues of one topic at once
    (``dledger consumer reset-offset``): all of them or none, in one entry."""

    group: str
    topic: str
    offsets: tuple[tuple[int, int], ...]  # (queue id, the next offset to consume)


BrokerEntry = Union[SendEntry, SendRunsEntry, TopicPut, TopicDelete, OffsetCommit, TimerDeliver,
                    LockQueues, TxnEnd, TxnCheck, OffsetReset]


# -- encode ---------------------------------------------------------------------------------------


def encode(entry: BrokerEntry) -> bytes:
    if isinstance(entry, SendEntry):
        return encode_send(entry.topic, entry.queue_id, entry.store_ts_ms,
                           _wire(entry.messages), entry.auto_create, entry.default_queues)
    if isinstance(entry, SendRunsEntry):
        return encode_runs(entry.store_ts_ms, [[r.topic, r.queue_id, _wire(r.messages),
                                                r.auto_create, r.default_queues]
                                               for r in entry.runs])
    fields: list[Any]
    if isinstance(entry, TopicPut):
        fields = [KIND_TOPIC_PUT, entry.name, entry.read_queues, entry.write_queues, entry.perm,
                  entry.system]
    elif isinstance(entry, TopicDelete):
        fields = [KIND_TOPIC_DELETE, entry.name]
    elif isinstance(entry, OffsetCommit):
        fields = [KIND_OFFSET_COMMIT, entry.group, entry.topic, entry.queue_id, entry.offset]
    elif isinstance(entry, LockQueues):
        fields = [KIND_LOCK_QUEUES if entry.lock else KIND_UNLOCK_QUEUES, entry.store_ts_ms,
                  entry.group, entry.client_id, [list(q) for q in entry.queues], entry.ttl_ms]
    elif isinstance(entry, TimerDeliver):
        fields = [KIND_TIMER_DELIVER, entry.store_ts_ms, entry.auto_create, entry.default_queues,
                  [list(item) for item in entry.items]]
    elif isinstance(entry, TxnEnd):
        fields = [KIND_TXN_END, entry.store_ts_ms, entry.producer_group, entry.txn_id,
                  entry.decision, list(entry.halves), [list(i) for i in entry.items],
                  [list(o) for o in entry.offsets], entry.check_max, entry.from_check,
                  entry.auto_create, entry.default_queues]
    elif isinstance(entry, TxnCheck):
        fields = [KIND_TXN_CHECK, entry.store_ts_ms, [list(c) for c in entry.checks]]
    elif isinstance(entry, OffsetReset):
        fields = [KIND_OFFSET_RESET, entry.group, entry.topic, [list(q) for q in entry.offsets]]
    else:
        raise TypeError(f"not a broker entry: {entry!r}")
    return cbor2.dumps([VERSION, *fields])


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


def _wire(messages: tuple[Message, ...]) -> list[list[Any]]:
    return [[m.body, m.tags, list(m.keys), m.unique_key, [list(p) for p in m.properties],
             m.born_ts_ms] for m in messages]


# -- decode ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredSend:
    """A send entry as the state machine applies it: every message checked exactly as
    ``decode`` checks it, but left in entry form (``[body, tags, [keys], unique_key, [[name,
    value]], born_ts_ms]``), since applying needs only sizes, tags and unique keys."""

    topic: str
    queue_id: int
    store_ts_ms: int
    messages: list[list[Any]]
    auto_create: bool
    default_queues: int


def decode(payload: bytes) -> BrokerEntry:
    kind, rest = _fields(payload)
    decoder = _DECODERS.get(kind) if isinstance(kind, int) else None
    if decoder is None:
        raise BadEntryError(f"unknown broker entry kind {kind!r}")
    try:
        return decoder(rest)
    except (TypeError, ValueError) as err:
        raise BadEntryError(f"malformed entry of kind {kind}: {err}") from err


@dataclass(frozen=True, slots=True)
class StoredRuns:
    """A multi-run send entry as the state machine applies it: each run a ``StoredSend`` (with
    the entry's store time), checked exactly as ``decode`` checks it."""

    store_ts_ms: int
    runs: list[StoredSend]


def decode_for_apply(payload: bytes) -> BrokerEntry | StoredSend | StoredRuns:
    """As ``decode``, refusing exactly the same payloads, but a send comes as a ``StoredSend``
    and a multi-run send as ``StoredRuns`` (no ``Message`` objects built: the replicas' hot
    path)."""
    kind, rest = _fields(payload)
    # (as decode: True counts as 1)
    if not isinstance(kind, int) or (kind != KIND_SEND and kind != KIND_SEND_RUNS):
        return decode(payload)
    try:
        if kind == KIND_SEND_RUNS:
            ts, runs = rest
            ts = _int(ts)
            return StoredRuns(ts, [_stored_send(*_run_fields(r), ts) for r in _runs(runs)])
        topic, queue_id, ts, msgs, auto_create, default_queues = rest
        return _stored_send(topic, queue_id, msgs, auto_create, default_queues, _int(ts))
    except (TypeError, ValueError) as err:
        raise BadEntryError(f"malformed entry of kind {kind}: {err}") from err


def _stored_send(topic: Any, queue_id: Any, msgs: Any, auto_create: Any, default_queues: Any,
                 ts: int) -> StoredSend:
    if not isinstance(msgs, list) or not msgs:
        raise ValueError("a send carries at least one message")
    for m in msgs:
        check_message(m)
    return StoredSend(_str(topic), _int(queue_id), ts, msgs, _bool(auto_create),
                      _int(default_queues, 1))


def _runs(runs: Any) -> list[Any]:
    if not isinstance(runs, list) or not runs:
        raise ValueError("a multi-run send carries at least one run")
    return runs


def _run_fields(run: Any) -> tuple[Any, Any, Any, Any, Any]:
    if type(run) is not list:
        raise ValueError("a run must be a list")
    topic, queue_id, msgs, auto_create, default_queues = run
    return topic, queue_id, msgs, auto_create, default_queues


def stored_messages(payload: bytes) -> list[Any]:
    """The messages of an applied send entry (either kind) in entry form, indexed by slot. For
    reads of entries the state machine stored: ``decode_for_apply`` checked them then."""
    kind, rest = _fields(payload)
    if kind == KIND_SEND_RUNS:
        return [m for run in rest[1] for m in run[2]]
    if kind == KIND_TIMER_DELIVER:
        return [item[4] for item in rest[3]]
    if kind == KIND_TXN_END:
        return [item[2] for item in rest[5]]
    if kind == broker.features.pop.entries.KIND_POP_DEAD:
        return [rest[7]]
    if kind != KIND_SEND:
        raise BadEntryError(f"entry of kind {kind!r} holds no messages")
    msgs: list[Any] = rest[3]
    return msgs


# What each entry that stores messages stores, for the key index (``broker.features.query.index``) and message
# query: its store time and its runs of messages, (topic, queue id, [message in entry form...]),
# slots counting on across the runs. An entry type that stores messages (as ``decode_for_apply``
# gives it) adds one line to STORED_BY_TYPE.
StoredRun = tuple[str, int, list[Any]]
StoredTopics = tuple[int, list[StoredRun]]


def _stored_of_send(e: Any) -> StoredTopics:
    return e.store_ts_ms, [(e.topic, e.queue_id, e.messages)]


def _stored_of_runs(e: Any) -> StoredTopics:
    return e.store_ts_ms, [(r.topic, r.queue_id, r.messages) for r in e.runs]


def _stored_of_timers(e: Any) -> StoredTopics:
    return e.store_ts_ms, [(topic, qid, [m]) for _, _, topic, qid, m in e.items]


def _stored_of_txn_end(e: Any) -> StoredTopics:
    # A commit's copies for their real queues (a rollback after the last check-back stores
    # them in the check-max topic instead: the consume queues tell, at query time).
    return e.store_ts_ms, [(topic, qid, [m]) for topic, qid, m in e.items]


STORED_BY_TYPE: dict[type, Callable[[Any], StoredTopics]] = {
    StoredSend: _stored_of_send,
    StoredRuns: _stored_of_runs,
    TimerDeliver: _stored_of_timers,
    TxnEnd: _stored_of_txn_end,
}


def stored_topics_and_messages(entry: object) -> StoredTopics | None:
    """(store time, [(topic, queue id, [message...])...]) of an entry as ``decode_for_apply``
    gives it: a send's or run's topic and queue, a delivered timer's real topic and queue; None
    for an entry that stores no message. A message listed may still have been refused at apply
    (a duplicate, a timer delivered already): the consume queues say which were stored."""
    fn = STORED_BY_TYPE.get(type(entry))
    return fn(entry) if fn is not None else None


def message_at(stored: StoredTopics, slot: int) -> StoredRun | None:
    """(topic, queue id, message) at ``slot`` of what an entry stores, or None past its end."""
    for topic, qid, messages in stored[1]:
        if slot < len(messages):
            return topic, qid, messages[slot]
        slot -= len(messages)
    return None


def message_of(m: list[Any]) -> Message:
    """A stored message (entry form, as ``stored_messages`` gives it) as a ``Message``."""
    return _message(m)


def _fields(payload: bytes) -> tuple[Any, list[Any]]:
    try:
        arr = cbor2.loads(payload)
    except Exception as err:  # noqa: BLE001 - cbor2 raises many types on garbage; all are bad input
        raise BadEntryError(f"not CBOR: {err}") from err
    if not isinstance(arr, list) or len(arr) < 2 or arr[0] != VERSION:
        raise BadEntryError("not a broker entry of this version")
    return arr[1], arr[2:]


def check_message(m: Any) -> None:
    """Raise ValueError/TypeError where ``_message`` would; the common shape (a list, no keys, no
    properties) is checked without building anything. The leader runs it on every message it
    accepts, so that no replica refuses what the leader proposed."""
    if type(m) is list and len(m) == 6:
        body, tags, keys, unique_key, props, born = m
        if (type(body) is bytes and type(tags) is str and type(unique_key) is str
                and type(born) is int and 0 <= born <= INT_MAX and type(keys) is list and not keys
                and type(props) is list and not props):
            return
    _message(m)  # the full check: raises on anything it refuses
    if type(m) is not list:
        raise ValueError("a message must be a list")




def _int(v: Any, lo: int = 0, what: str = "the field") -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= INT_MAX:
        raise ValueError(f"{what} must be an integer in {lo}..{INT_MAX}, not {v!r}")
    return v


def _str(v: Any, what: str = "the field") -> str:
    if not isinstance(v, str):
        raise ValueError(f"{what} must be a string, not {type(v).__name__}")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"expected a bool, got {type(v).__name__}")
    return v


def _message(m: Any) -> Message:
    body, tags, keys, unique_key, props, born = m
    if not isinstance(body, bytes):
        raise ValueError("message body must be bytes")
    if not isinstance(keys, list) or not isinstance(props, list):
        raise ValueError("message keys and properties must be lists")
    # the common message has no keys and no properties: skip building and checking them
    keys_t = tuple(_str(k, "a key") for k in keys) if keys else ()
    props_t = tuple((_str(k, "a property name"), _str(v, f"property {k!r}")) for k, v in props
                    ) if props else ()
    return Message(body, _str(tags, "tags"), keys_t, _str(unique_key, "the unique key"), props_t,
                   _int(born, what="born_ts_ms"))


def _send(f: list[Any]) -> SendEntry:
    topic, queue_id, ts, msgs, auto_create, default_queues = f
    if not isinstance(msgs, list) or not msgs:
        raise ValueError("a send carries at least one message")
    return SendEntry(_str(topic), _int(queue_id), _int(ts), tuple(_message(m) for m in msgs),
                     _bool(auto_create), _int(default_queues, 1))


def _send_runs(f: list[Any]) -> SendRunsEntry:
    ts, runs = f
    out = []
    for run in _runs(runs):
        topic, queue_id, msgs, auto_create, default_queues = _run_fields(run)
        if not isinstance(msgs, list) or not msgs:
            raise ValueError("a send carries at least one message")
        out.append(SendRun(_str(topic), _int(queue_id), tuple(_message(m) for m in msgs),
                           _bool(auto_create), _int(default_queues, 1)))
    return SendRunsEntry(_int(ts), tuple(out))


def _topic_put(f: list[Any]) -> TopicPut:
    name, r, w, perm, system = f
    return TopicPut(_str(name), _int(r), _int(w), _int(perm), _bool(system))


def _topic_delete(f: list[Any]) -> TopicDelete:
    (name,) = f
    return TopicDelete(_str(name))


def _offset_commit(f: list[Any]) -> OffsetCommit:
    group, topic, queue_id, offset = f
    return OffsetCommit(_str(group), _str(topic), _int(queue_id), _int(offset))


def _timer_deliver(f: list[Any]) -> TimerDeliver:
    ts, auto_create, default_queues, items = f
    if not isinstance(items, list) or not items:
        raise ValueError("a delivery carries at least one timer")
    out = []
    for item in items:
        if type(item) is not list or len(item) != 5:
            raise ValueError("a delivered timer is [offset, due, topic, queue id, message]")
        offset, due, topic, queue_id, m = item
        check_message(m)
        out.append((_int(offset), _int(due), _str(topic), _int(queue_id), m))
    return TimerDeliver(_int(ts), tuple(out), _bool(auto_create), _int(default_queues, 1))


def _pairs(v: Any, shape: str) -> list[list[Any]]:
    """A list of two-item lists (``shape`` names them in the error)."""
    if not isinstance(v, list) or any(type(p) is not list or len(p) != 2 for p in v):
        raise ValueError(f"expected a list of {shape}")
    return v


def _lock_queues(f: list[Any], lock: bool = True) -> LockQueues:
    ts, group, client_id, queues, ttl_ms = f
    out = tuple((_str(t), _int(q)) for t, q in _pairs(queues, "[topic, queue id]"))
    return LockQueues(_int(ts), _str(group), _str(client_id), out, lock, _int(ttl_ms))


def _unlock_queues(f: list[Any]) -> LockQueues:
    return _lock_queues(f, lock=False)


def _offset_reset(f: list[Any]) -> OffsetReset:
    group, topic, offsets = f
    out = tuple((_int(q), _int(o)) for q, o in _pairs(offsets, "[queue id, offset]"))
    if not out:
        raise ValueError("a reset carries at least one [queue id, offset]")
    return OffsetReset(_str(group), _str(topic), out)


def _txn_end(f: list[Any]) -> TxnEnd:
    ts, group, txn_id, decision, halves, items, offsets, check_max, from_check, auto, queues = f
    if decision not in ("COMMIT", "ROLLBACK"):
        raise ValueError(f"a transaction ends in COMMIT or ROLLBACK, not {decision!r}")
    if not isinstance(halves, list) or (not halves and (decision != "COMMIT" or not offsets)):
        raise ValueError("a transaction's end names its half messages (only a commit of "
                         "consumer offsets alone names none)")
    if not isinstance(items, list) or not isinstance(offsets, list):
        raise ValueError("a transaction's copies and offsets are lists")
    out_items = []
    for item in items:
        if type(item) is not list or len(item) != 3:
            raise ValueError("a committed copy is [topic, queue id, message]")
        check_message(item[2])
        out_items.append((_str(item[0]), _int(item[1]), item[2]))
    if out_items and len(out_items) != len(halves):
        raise ValueError("a transaction's end carries one copy per half message, or none")
    out_offsets = []
    for o in offsets:
        if type(o) is not list or len(o) != 5:
            raise ValueError("an offset is [group, topic, queue id, expected, new]")
        out_offsets.append((_str(o[0]), _str(o[1]), _int(o[2]), _int(o[3], -1), _int(o[4])))
    return TxnEnd(_int(ts), _str(group), _str(txn_id), decision, tuple(_int(h) for h in halves),
                  tuple(out_items), tuple(out_offsets), _bool(check_max), _bool(from_check),
                  _bool(auto), _int(queues, 1))


def _txn_check(f: list[Any]) -> TxnCheck:
    ts, checks = f
    if not isinstance(checks, list) or not checks:
        raise ValueError("a check entry names at least one transaction")
    out = []
    for c in checks:
        if type(c) is not list or len(c) != 2:
            raise ValueError("a check is [txn id, checks]")
        out.append((_str(c[0]), _int(c[1], 1)))
    return TxnCheck(_int(ts), tuple(out))


_DECODERS: dict[int, Callable[[list[Any]], BrokerEntry]] = {
    KIND_SEND: _send, KIND_TOPIC_PUT: _topic_put, KIND_TOPIC_DELETE: _topic_delete,
    KIND_OFFSET_COMMIT: _offset_commit, KIND_SEND_RUNS: _send_runs,
    KIND_TIMER_DELIVER: _timer_deliver, KIND_LOCK_QUEUES: _lock_queues,
    KIND_UNLOCK_QUEUES: _unlock_queues, KIND_TXN_END: _txn_end, KIND_TXN_CHECK: _txn_check,
    KIND_OFFSET_RESET: _offset_reset}

# The pop kinds (12-15) live in their own module, which adds its decoders to the table above
# when imported: importing it here makes every user of this module decode them.
import broker.features.pop.entries  # noqa: E402,F401
import broker.features.acl.entries  # noqa: E402,F401  (the ACL kinds, 16-17, likewise)

__all__ = ["BrokerEntry", "LockQueues", "Message", "OffsetCommit", "OffsetReset", "SendEntry", "SendRun", "SendRunsEntry",
           "TimerDeliver", "TopicDelete", "TopicPut", "TxnCheck", "TxnEnd", "decode", "encode"]
