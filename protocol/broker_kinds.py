"""The broker's client protocol: request kinds and the shape of their arguments and results.

Frames, request ids, versioning and error responses are the log server's (``protocol.envelope``);
the kinds here start at 100. Requests (``[VERSION, kind, request_id, ...args]``):

- SEND ``topic, queue_id, [[body, tags, keys, unique_key, [[k, v]...], born_ts_ms], ...]`` ->
  ``[status, queue_id, [queue_offset...], [offset_msg_id...], [duplicate...], [queue_id...]]``
  (leader only; returns after the entry is committed and applied). One queue, all or nothing:
  RocketMQ's batch, whose total size (``message_bytes``) is at most the broker's maximum. An
  optional fourth argument, ``queues``, asks that many queues (1..1024, capped at the broker's
  default) for the topic if this send creates it (else BAD_REQUEST).
- SEND_RUNS ``[[topic, queue_id, [message...], (queues)], ...]`` -> one answer per run, in order:
  SEND's answer, or ``[code, detail]`` for a run refused (its topic unknown or read-only, its queue
  beyond the topic's, a message malformed or larger than the broker's maximum). Independent sends,
  each message to its own queue (the producer's group commit over several queues and topics); each
  run is all or nothing, and a refused run fails only itself.
- PULL ``topic, queue_id, offset, max_messages, max_bytes, suspend_ms, tags`` ->
  ``[status, next_offset, min_offset, max_offset, [message...]]``, a message being
  ``[queue_offset, body, tags, keys, unique_key, [[k, v]...], born_ts_ms, store_ts_ms, offset_msg_id]``
  (any replica: only committed messages exist there)
- PULL_SQL ``topic, queue_id, offset, max_messages, max_bytes, suspend_ms, sql`` -> PULL's answer,
  holding only the messages whose properties match the SQL92 expression (``protocol.filter_sql``);
  ``next_offset`` moves past the skipped ones too. A malformed expression: BAD_REQUEST naming
  its character offset
- TOPIC_PUT ``name, read_queues, write_queues, perm`` / TOPIC_DELETE ``name`` -> status (leader)
- OFFSET_COMMIT ``group, topic, queue_id, offset`` -> status (leader); OFFSET_QUERY
  ``group, topic, queue_id`` -> offset or -1 (any replica)
- BROKER_STATUS -> a dict (node status, topics)
- HEARTBEAT ``client_id, group, model, {topic: tags}, ttl_ms`` -> the group's live members
  (sorted client ids) as this node knows them; ``ttl_ms`` 0 leaves the group. Membership is
  per node and in memory (clients heartbeat every node), as RocketMQ's. When a heartbeat (or
  an expiry it finds) changes the group's members or their model or subscriptions, this node
  sends each other member on a connection of this protocol a CONSUMER_IDS_CHANGED frame
  ``[group]`` (RocketMQ's NOTIFY_CONSUMER_IDS_CHANGED): heartbeat again and rebalance now.
- TRANSFER_LEADERSHIP ``node_id`` -> true once that node leads (leader only)
- SEARCH_OFFSET ``topic, queue_id, timestamp_ms`` -> the first queue offset stored at or after
  that time (the queue's max offset if none is); any replica answers from committed data
- SEND_BACK ``group, topic, queue_id, offset, delay_level, max_reconsume_times`` -> ``[status,
  topic, reconsume_times, dead]``: a consumer of ``group`` failed that message; the leader
  stores its copy in ``%RETRY%<group>`` (delayed; level 0: 3 + reconsume times) or, past
  ``max_reconsume_times`` (or with level -1), in ``%DLQ%<group>`` (``broker.features.retry.model``)
- DLQ_RESEND ``group, offset`` -> ``[status, topic]``: the dead letter at that offset of
  ``%DLQ%<group>`` back into ``%RETRY%<group>`` with its reconsume count reset (leader)
- LOCK_BATCH ``group, client_id, [[topic, queue_id]...]`` -> the queues granted (locked or
  renewed for 60 s; ``broker.features.orderly.model``); UNLOCK_BATCH the same -> true (leader)
- TXN_HALF ``producer_group, transaction_id, topic, queue_id, [message...]`` -> SEND's answer
  (queue offsets in the half queue): half messages of that transaction, invisible until it
  commits (``broker.features.txn.model``; leader). A delayed one is BAD_TRANSACTION.
- END_TRANSACTION ``producer_group, transaction_id, decision, from_check, [[group, topic,
  queue_id, expected, new]...]`` -> ``[decision, [[topic, queue_id, queue_offset,
  offset_msg_id]...]]``: COMMIT (the half messages become visible, the consumer offsets set if
  each is still ``expected``, else OFFSET_CONFLICT and a rollback) or ROLLBACK; a repeated END
  answers as the first; the other decision after one is TXN_ALREADY_DECIDED (leader)
- PRODUCER_HEARTBEAT ``client_id, producer_group, ttl_ms`` -> the group's live producers on
  this node (sorted client ids); ``ttl_ms`` 0 leaves. The connection it came on is where this
  node sends that producer CHECK_TRANSACTION frames ``[group, producer_group,
  transaction_id, checks, [message...]]`` (a message as PULL's, its offset the half queue's)
- OFFSET_RESET ``group, topic, timestamp_ms, force`` -> ``[[queue_id, old, new]...]``: every read
  queue's offset of ``group`` set to the first one stored at or after the time (0: the first
  retained, INT_MAX: the max offset), in one entry (leader; ``broker.features.admin.handlers``).
  Refused (GROUP_ACTIVE) while live members of the group subscribe to the topic, unless ``force``
- CONSUMER_STATUS ``group`` -> ``{"node", "leader", "members": [...], "queues": [[topic,
  queue_id, committed, max]...]}``: this node's view of the group's live members (client id,
  model, subscriptions) and offsets (any replica; the leader's offsets are the latest)
- STATE_DIGEST -> ``[applied_index, crc32, log_first_index, log_last_index]``: a CRC32 of this
  node's whole state machine (topics, consume queues, offsets, dedup table, timers, locks,
  transactions) as its checkpoint would write it, so that replicas at the same applied index
  can be compared (any replica; ``broker.features.admin.handlers``)
- MEMBER_ADD ``node_id, peer_address, timeout_ms`` / MEMBER_PROMOTE ``node_id, timeout_ms`` /
  MEMBER_REMOVE ``node_id, timeout_ms`` -> ``{"voters", "learners", "config_index",
  "change_in_progress", "recovering"}`` once the change is committed: a node joins as a learner,
  a caught-up learner becomes a voter (PROMOTE waits for it to catch up), a member leaves
  (leader; ``broker.features.membership.handlers``). A change the group's rules refuse is
  MembershipChangeError, by name
- POP_RECEIVE ``group, topic, queue_id (-1: any), max_messages, invisible_ms, tags, sql ("":
  none), poll_ms, max_attempts`` -> ``[[queue_id, queue_offset, body, tags, keys, unique_key,
  [[k, v]...], born_ts_ms, store_ts_ms, offset_msg_id, epoch, attempt]...]``: messages handed
  out to ``group``, invisible to its other receives for ``invisible_ms``
  (``broker.features.pop.model``; leader; long-polls up to ``poll_ms``); past ``max_attempts``
  deliveries (unless the group has its own, SUBSCRIPTION_GROUP_PUT) a message goes to the
  group's dead-letter queue. Within a queue the higher ``PRIORITY`` comes first
  (``protocol.priority``), and a message whose ``TTL_MS`` passed never (``protocol.message_ttl``;
  PULL passes it too). POP_ACK ``group, topic, queue_id, [[offset, epoch]...]`` -> per
  receipt true (acknowledged, or already) or false (stale: redelivered or changed since);
  POP_CHANGE ``group, topic, queue_id, offset, epoch, invisible_ms`` -> the new epoch
  (INVALID_RECEIPT_HANDLE if stale); POP_DEAD ``group, topic, queue_id, offset, epoch,
  max_attempts`` -> the dead-letter topic the message went to (leader)
- VIEW_MESSAGE ``offset_msg_id`` -> a found message; QUERY_BY_KEY ``topic, key, begin_ms, end_ms,
  max_messages``, QUERY_BY_UNIQUE_KEY ``unique_key, topic ("": any), max_messages`` and
  QUERY_BY_TIME ``topic, begin_ms, end_ms, max_messages`` (every message of the topic stored in
  the range, from its consume queues; begin_ms after end_ms is BAD_REQUEST) -> a list of them,
  newest first (``broker.features.query.lookup``): ``[offset_msg_id, group, topic, queue_id,
  queue_offset, body, tags, keys, unique_key, [[k, v]...], born_ts_ms, store_ts_ms,
  [consumer group...]]``, the groups being those whose committed offset is past it. Any replica
  answers from what it has applied; an unknown id is MESSAGE_NOT_FOUND
- ACL_PUT ``[access_key, secret_key, admin, default_topic_perm, default_group_perm, [[topic,
  perm]...], [[group, perm]...]]`` (perm 0 DENY, 1 PUB, 2 SUB, 3 PUB|SUB; each list sorted by
  name) -> "OK" once committed: the account added or replaced; ACL_DELETE ``access_key`` -> "OK"
  or ACCOUNT_NOT_FOUND (leader); ACL_LIST ``access_key`` ("": all) -> the accounts without
  their secrets (any replica; ``broker.features.acl.service``). Admin only.
- CONSUMER_RUNNING_INFO ``group, client_id`` -> what that consumer says of itself (a dict:
  RocketMQ's ConsumerRunningInfo: properties, subscriptions, per-queue progress), and
  CONSUME_DIRECTLY ``group, client_id, offset_msg_id`` -> ``{"consumeResult": CR_SUCCESS |
  CR_LATER | ..., "remark", "spentTimeMills", "order", "autoCommit"}``: that consumer consumes
  the message once more, outside its queues (RocketMQ's 307 / 309, asked on the consumer's own
  connection, ``broker.features.clients``). Served by a node the consumer heartbeats on (the
  message's group's, for CONSUME_DIRECTLY); elsewhere CLIENT_NOT_CONNECTED. Admin only.
- SUBSCRIPTION_GROUP_PUT ``group, max_delivery_attempts`` (1..10000, or null: back to the
  broker's default) -> the group's settings once committed; SUBSCRIPTION_GROUP_GET ``group``
  ("": every group with a setting) -> ``{"default_max_delivery_attempts", "groups": [{"group",
  "max_delivery_attempts"}...]}``: a consumer group's retry policy as this broker group keeps it,
  RocketMQ's subscription group config (leader; ``broker.features.admin.model``). Admin only.
- RECALL ``topic, message_id, position, slot`` -> the message id: the delayed message
  whose schedule copy is at that commitlog position and slot (a delayed send's offset msg id
  names it) is never delivered (``broker.features.delay.handlers``; leader). MESSAGE_NOT_FOUND if
  no such delayed message is there; NOT_RECALLABLE once it is no longer pending (delivered, or
  recalled already)

With access control on (``--acl``), every request comes in a SIGNED envelope
(``protocol.auth``); an unsigned one, a bad signature, a stale or replayed one is
SIGNATURE_REFUSED, a request the account may not make ACCESS_DENIED (``broker.features.acl.service``).

The broker checks every request itself (``broker.core.requests``): the argument count, each field's
type and range (integers are never negative; a bool is not an integer), reserved topic names,
and the read rules (read permission, read-queue count). Anything else is a BAD_REQUEST error
naming the field. A pull's ``max_messages`` is capped at MAX_PULL_MESSAGES and its
``suspend_ms`` at MAX_SUSPEND_MS; ``max_messages`` 0 answers the queue's offsets only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from protocol.broker_errors import BrokerError

SEND = 100
PULL = 101
TOPIC_PUT = 102
TOPIC_DELETE = 103
OFFSET_COMMIT = 104
OFFSET_QUERY = 105
BROKER_STATUS = 106
HEARTBEAT = 107
TRANSFER_LEADERSHIP = 108
SEARCH_OFFSET = 109
SEND_RUNS = 110
SEND_BACK = 111
DLQ_RESEND = 112
LOCK_BATCH = 113
UNLOCK_BATCH = 114
PULL_SQL = 115
TXN_HALF = 116
END_TRANSACTION = 117
PRODUCER_HEARTBEAT = 118
VIEW_MESSAGE = 120
QUERY_BY_KEY = 121
QUERY_BY_UNIQUE_KEY = 122
QUERY_BY_TIME = 123
OFFSET_RESET = 124
CONSUMER_STATUS = 125
STATE_DIGEST = 126
MEMBER_ADD = 127
MEMBER_PROMOTE = 128
MEMBER_REMOVE = 129
POP_RECEIVE = 130
POP_ACK = 131
POP_CHANGE = 132
POP_DEAD = 133
ACL_PUT = 134
ACL_DELETE = 135
ACL_LIST = 136
CONSUMER_RUNNING_INFO = 137
CONSUME_DIRECTLY = 138
SUBSCRIPTION_GROUP_PUT = 146
SUBSCRIPTION_GROUP_GET = 147
RECALL = 148
# Server-initiated frames (150-159), sent by a broker on a client's connection: not requests
# of the client protocol, and not answered under their own id.
CHECK_TRANSACTION = 150
CONSUMER_IDS_CHANGED = 151
SEND_KINDS = frozenset({SEND, SEND_RUNS})
# The kinds a broker serves are SEND_KINDS and those of its handler table (``broker.core.requests``).

FOUND = "FOUND"
NO_NEW_MSG = "NO_NEW_MSG"
OFFSET_OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"

MAX_MESSAGE_BYTES = 4 << 20  # the broker's default maximum of a message or a batch (RocketMQ's)
# The most any broker may be configured to take (``--max-message-bytes``), and so all a client
# checks before sending: an entry must fit a peer frame (16 MiB) with room for its encoding.
MAX_MESSAGE_BYTES_CEILING = 8 << 20
MESSAGE_OVERHEAD_BYTES = 20  # per message, in the size count (RocketMQ's batch splitter's)
MAX_PULL_MESSAGES = 1024
INT_MAX = 2**63 - 1  # every integer field a broker takes fits a signed 64-bit column
RESET_EARLIEST_MS = 0  # OFFSET_RESET "to the time 0": the first message the leader still holds
RESET_LATEST_MS = INT_MAX  # ... "to the end of time": past the last message stored
MAX_SUSPEND_MS = 15_000  # long polling waits at most this long (RocketMQ's default)


class SendRefusedError(BrokerError):
    """The broker refused a send: a named status (TOPIC_NOT_FOUND, NO_PERMISSION, ...)."""

    def __init__(self, status: str, detail: str = "") -> None:
        super().__init__(f"{status}: {detail}" if detail else status)
        self.status = status
        self.code = status
        self.detail = detail


class MessageTooLargeError(BrokerError):
    """A message or a batch exceeds the size limits."""

    code = "MESSAGE_TOO_LARGE"


def message_bytes(topic: str, body: bytes, tags: str, keys: Sequence[str], unique_key: str,
                  properties: Sequence[Sequence[str]]) -> int:
    """A message's size as RocketMQ counts it against its 4 MiB limit: topic, body, each
    property's name and value (tags, keys and the unique key are properties there: ``TAGS``,
    ``KEYS`` space-separated, ``UNIQ_KEY``), and 20 bytes of overhead; strings in UTF-8 bytes.
    The broker enforces its maximum with this count and the client's splitter uses it too."""
    n = _utf8(topic) + len(body) + 8 + _utf8(unique_key) + MESSAGE_OVERHEAD_BYTES  # 8: UNIQ_KEY
    if tags:
        n += 4 + _utf8(tags)
    if keys:
        n += 4 + sum(_utf8(k) for k in keys) + len(keys) - 1
    for name, value in properties:
        n += _utf8(name) + _utf8(value)
    return n


UNIQ_KEY = "UNIQ_KEY"
# A stored unique key is the sender's and, after this mark, a digest of the message's content
# that the leader adds (``broker.core.sendwire.scoped_key``): the dedup table's key. A control
# character (the unit separator), so that no key stored before the leaders scoped keys holds
# one, as ``#`` would (a pipeline's keyed outputs, a 4.x send's): their ids read unchanged.
SCOPE_MARK = "\x1f"


SCOPE_CHARS = 17  # the mark and 16 hex digits


def unscoped(unique_key: str) -> str:
    """The unique key as its sender gave it: the stored one less its scope (a key stored before
    the leaders scoped keys has none)."""
    if len(unique_key) > SCOPE_CHARS and unique_key[-SCOPE_CHARS] == SCOPE_MARK:
        return unique_key[:-SCOPE_CHARS]
    return unique_key


def message_id(unique_key: str, properties: Iterable[Sequence[str]]) -> str:
    """The message id a consumer sees: the ``UNIQ_KEY`` property where the message carries one
    (a retry or dead-letter copy, a 4.x client's send), else its stored unique key unscoped."""
    for name, value in properties:
        if name == UNIQ_KEY:
            return value
    return unscoped(unique_key)


def _utf8(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def offset_msg_id(group: str, position: int, slot: int) -> str:
    """Names a stored message on any replica: group, commitlog position, slot in the entry."""
    return f"{group}-{position:016X}-{slot}"


_OFFSET_MSG_ID = re.compile(r"(.+)-([0-9A-F]{16})-([0-9]{1,6})")


def parse_offset_msg_id(text: str) -> tuple[str, int, int]:
    """(group, commitlog position, slot) of ``offset_msg_id``'s form; a ValueError saying why
    if it is not one (the broker's and the client's one reading of it)."""
    m = _OFFSET_MSG_ID.fullmatch(text)
    if m is None:
        raise ValueError(f"is not an offset msg id (GROUP-<16 hex digits>-SLOT): {text[:80]!r}")
    return m.group(1), int(m.group(2), 16), int(m.group(3))
