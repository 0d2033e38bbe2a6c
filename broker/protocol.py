"""The broker's client protocol: request kinds and the shape of their arguments and results.

Frames, request ids, versioning and error responses are the log server's (``dledger.protocol``);
the kinds here start at 100. Requests (``[VERSION, kind, request_id, ...args]``):

- SEND ``topic, queue_id, [[body, tags, keys, unique_key, [[k, v]...], born_ts_ms], ...]`` ->
  ``[status, queue_id, [queue_offset...], [offset_msg_id...], [duplicate...], [queue_id...]]``
  (leader only; returns after the entry is committed and applied)
- PULL ``topic, queue_id, offset, max_messages, max_bytes, suspend_ms, tags`` ->
  ``[status, next_offset, min_offset, max_offset, [message...]]``, a message being
  ``[queue_offset, body, tags, keys, unique_key, [[k, v]...], born_ts_ms, store_ts_ms, offset_msg_id]``
  (any replica: only committed messages exist there)
- TOPIC_PUT ``name, read_queues, write_queues, perm`` / TOPIC_DELETE ``name`` -> status (leader)
- OFFSET_COMMIT ``group, topic, queue_id, offset`` -> status (leader); OFFSET_QUERY
  ``group, topic, queue_id`` -> offset or -1 (any replica)
- BROKER_STATUS -> a dict (node status, topics)
- HEARTBEAT ``client_id, group, model, {topic: tags}, ttl_ms`` -> the group's live members
  (sorted client ids) as this node knows them; ``ttl_ms`` 0 leaves the group. Membership is
  per node and in memory (clients heartbeat every node), as RocketMQ's.
- TRANSFER_LEADERSHIP ``node_id`` -> true once that node leads (leader only)
- SEARCH_OFFSET ``topic, queue_id, timestamp_ms`` -> the first queue offset stored at or after
  that time (the queue's max offset if none is); any replica answers from committed data

The broker checks every request itself (``broker.handlers``): the argument count, each field's
type and range (integers are never negative; a bool is not an integer), reserved topic names,
and the read rules (read permission, read-queue count). Anything else is a BAD_REQUEST error
naming the field. A pull's ``max_messages`` is capped at MAX_PULL_MESSAGES and its
``suspend_ms`` at MAX_SUSPEND_MS; ``max_messages`` 0 answers the queue's offsets only.
"""

from __future__ import annotations

from broker.errors import BrokerError

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
# The kinds a broker serves are SEND and those of its handler table (``broker.handlers``).

FOUND = "FOUND"
NO_NEW_MSG = "NO_NEW_MSG"
OFFSET_OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"

MAX_MESSAGE_BYTES = 4 << 20
MAX_BATCH_BYTES = 4 << 20  # one send request (RocketMQ's batch limit)
MAX_PULL_MESSAGES = 1024
MAX_SUSPEND_MS = 15_000  # long polling waits at most this long (RocketMQ's default)


class SendRefusedError(BrokerError):
    """The broker refused a send: a named status (TOPIC_NOT_FOUND, NO_PERMISSION, ...)."""

    def __init__(self, status: str, detail: str = "") -> None:
        super().__init__(f"{status}: {detail}" if detail else status)
        self.status = status
        self.code = status


class MessageTooLargeError(BrokerError):
    """A message or a batch exceeds the size limits."""

    code = "MESSAGE_TOO_LARGE"


def offset_msg_id(group: str, position: int, slot: int) -> str:
    """Names a stored message on any replica: group, commitlog position, slot in the entry."""
    return f"{group}-{position:016X}-{slot}"


def offset_msg_ids(group: str, position: int, count: int) -> list[str]:
    """``offset_msg_id`` of slots 0 .. count-1 of one entry (the prefix is built once)."""
    prefix = f"{group}-{position:016X}-"
    return [prefix + str(slot) for slot in range(count)]
