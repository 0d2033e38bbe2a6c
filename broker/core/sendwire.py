"""The send requests at the leader, in wire form: every field of a message checked (a named
error, never a coercion: RocketMQ's properties are strings to strings), each message's size
counted as RocketMQ counts it (``protocol.message_bytes``) against the broker's maximum, and the
answers of an applied send entry, one per run, with the message ids of the stored originals.

Pure functions of their arguments; the server supplies its limits and its group's name.
"""

from __future__ import annotations

from hashlib import blake2b
from typing import Any

from broker.core.applied import ApplyResult
from broker.core.codec import check_message
from protocol.broker_errors import BadEntryError
from protocol.broker_kinds import (
    MESSAGE_OVERHEAD_BYTES,
    SCOPE_MARK,
    MessageTooLargeError,
    message_bytes,
    offset_msg_id,
)
from protocol.frames import DEFAULT_MAX_FRAME_BYTES
from protocol.message_ttl import TTL_PROPERTY, parse_ttl_ms
from protocol.priority import PRIORITY_PROPERTY, parse_priority
from protocol.topics import HALF_TOPIC, SCHEDULE_TOPIC

# An entry larger than this could not travel to a follower in one peer frame (the append
# request's own fields need the rest), and a group would stall on it: refused at the leader.
MAX_ENTRY_BYTES = DEFAULT_MAX_FRAME_BYTES - (64 << 10)
SEND_OK = "SEND_OK"
# Seeded bug (tests only): "dedup_key_only" has the leader store the sender's key unscoped
# (``broker.api.sendpath``), as before ``scoped_key``: another message sent under a key already
# taken is answered as its duplicate and never stored (the chaos workload's shared keys).
SCOPE_CANARIES = frozenset({"dedup_key_only"})


def wire_messages(topic: str, raw: Any, max_bytes: int,
                  batch: bool) -> tuple[list[list[Any]], int, bool]:
    """A run's messages checked, as sent (entry form); returns them, their total size and
    whether any has properties (only those can be delayed: ``broker.features.delay.model``). A
    ``batch`` (SEND: one queue, all or nothing) is limited in total, as RocketMQ's batch is;
    otherwise (SEND_RUNS: independent sends) each message is. ``topic`` is already valid (so
    ASCII). Raises ``BadEntryError`` or ``MessageTooLargeError``."""
    if type(raw) is not list or not raw:
        raise BadEntryError("a send carries a non-empty list of messages")
    # message_bytes's common case inline (no keys or properties, ASCII strings): the hot path
    base = len(topic) + 8 + MESSAGE_OVERHEAD_BYTES
    total = 0
    with_props = False
    out: list[list[Any]] = []
    for k, m in enumerate(raw):
        try:
            check_message(m)  # what every replica checks at apply: never propose what it refuses
        except (TypeError, ValueError) as err:
            raise BadEntryError(f"message {k}: {err}") from err
        body, tags, keys, unique_key, props, born = m
        # a new list: a caller may send its own again (a retry), and it must scope alike
        out.append([body, tags, keys, scoped_key(unique_key, body, tags, keys, props), props,
                    born] if unique_key else m)
        if keys or props or not (tags.isascii() and unique_key.isascii()):
            _check_pairs(k, props)
            with_props = with_props or bool(props)
            n = message_bytes(topic, body, tags, keys, unique_key, props)
        else:
            n = base + len(body) + len(unique_key) + (4 + len(tags) if tags else 0)
        if not batch and n > max_bytes:
            raise MessageTooLargeError(f"message of {n} bytes exceeds {max_bytes}")
        total += n
    if batch and total > max_bytes:
        raise MessageTooLargeError(f"batch of {total} bytes exceeds {max_bytes}")
    return out, total, with_props


def scoped_key(unique_key: str, body: bytes, tags: str, keys: list[str],
               props: list[list[str]]) -> str:
    """The unique key a message is stored (and deduplicated) under: its sender's, then
    ``SCOPE_MARK`` and a 64-bit BLAKE2b digest of its content as sent (tags, keys, properties,
    body; not its born time), in hex. A retry (the same message again) is stored once; another
    message sent under the same key is stored as well, not answered as the first's duplicate:
    keys are no secret (consumers see them, clients draw them in sequence), and a sender who
    could make another's message a "duplicate" of its own would have it acknowledged and never
    stored. Consumers see the key unscoped (``message_id``). The digest reads a head that ends
    where its counts say (how many keys and properties, then each string length-prefixed:
    tags, keys, names and values), then the body: no two contents read alike."""
    if keys or props:
        head = bytearray(len(keys).to_bytes(4, "little") + len(props).to_bytes(4, "little"))
        for text in (tags, *keys, *(x for p in props for x in p)):
            data = text.encode("utf-8", "surrogatepass")
            head += len(data).to_bytes(4, "little") + data
        digest = blake2b(head, digest_size=8, person=_PERSON)
    elif tags:
        data = tags.encode("utf-8", "surrogatepass")
        digest = blake2b(_NONE_COUNTED + len(data).to_bytes(4, "little") + data, digest_size=8,
                         person=_PERSON)
    else:
        digest = _UNTAGGED.copy()
    digest.update(body)
    return f"{unique_key}{SCOPE_MARK}{digest.hexdigest()}"


_PERSON = b"dledger-uniq"
_NONE_COUNTED = bytes(8)  # no keys, no properties
_UNTAGGED = blake2b(_NONE_COUNTED + bytes(4), digest_size=8, person=_PERSON)  # the head of
# a message of no tags, keys or properties: its digest is this one's copy, the body added


CHECKED = {TTL_PROPERTY: parse_ttl_ms, PRIORITY_PROPERTY: parse_priority}  # property: its check


def _check_pairs(k: int, props: list[Any]) -> None:
    """Stricter than the replicas' check, which must keep accepting what older leaders stored:
    each property is a [name, value] list (check_message has checked that both are strings),
    and a TTL (``protocol.message_ttl``) or a priority (``protocol.priority``) a valid one."""
    for p in props:
        if type(p) is not list or len(p) != 2:
            raise BadEntryError(f"message {k}: a property must be a [name, value] pair, not {p!r}")
        if p[0] in CHECKED:
            try:
                CHECKED[p[0]](p[1])
            except ValueError as err:
                raise BadEntryError(f"message {k}: {err}") from err


def run_answers(group: str, position: int, result: ApplyResult) -> list[list[Any]]:
    """One answer per run of an applied send entry at commitlog ``position``: SEND's answer
    (status, queue id, then per message its queue offset, message id, duplicate flag and queue
    id), or ``[code, detail]`` for a refused run. A duplicate's id names the stored original."""
    prefix = f"{group}-{position:016X}-"
    out: list[list[Any]] = []
    for run in result.run_results():
        if run.status != SEND_OK:
            out.append([run.status, run.detail or run.topic])
            continue
        first = run.first_slot
        ids = [prefix + str(first + k) for k in range(len(run.queue_offsets))]
        for k, original_position, slot in run.originals:
            ids[k] = offset_msg_id(group, original_position, slot)
        # a delayed message's queue offset is known once it is delivered: -1 until then
        offsets = [-1] * len(ids) if run.topic == SCHEDULE_TOPIC else list(run.queue_offsets)
        # a delayed or half message's run is in one system queue: answer with its real queue
        queue_id = run.queue_ids[0] if run.topic in (SCHEDULE_TOPIC, HALF_TOPIC) \
            and run.queue_ids else run.queue_id
        out.append([SEND_OK, queue_id, offsets, ids, list(run.duplicates), list(run.queue_ids)])
    return out


def check_entry_size(data: bytes) -> bytes:
    if len(data) > MAX_ENTRY_BYTES:
        raise MessageTooLargeError(f"an entry of {len(data)} bytes exceeds {MAX_ENTRY_BYTES}")
    return data


__all__ = ["MAX_ENTRY_BYTES", "SCOPE_CANARIES", "check_entry_size", "run_answers", "scoped_key",
           "wire_messages"]
