"""Retry and dead letters, the pure part: what a consumer's send-back of a failed message puts
where (RocketMQ's ``consumerSendMsgBack``).

A message a clustering consumer failed (its listener said later, raised, or timed out) is sent
back by the consumer naming its queue and offset; the leader reads it from the commitlog and
stores a copy in ``%RETRY%<group>`` delayed by level ``3 + reconsume times`` (10 s, 30 s, 1 m,
2 m ... 2 h with the default levels), or, once it has been reconsumed ``max_reconsume_times``
times (16 by default), in ``%DLQ%<group>`` at once. The copy keeps the body, tags, keys and
properties, and carries RocketMQ's properties: ``RETRY_TOPIC`` (the original topic),
``ORIGIN_MESSAGE_ID`` (the original's offset message id), ``UNIQ_KEY`` (the original's msg id,
which consumers see as the message id of every copy) and ``RECONSUME_TIME``.

A copy's unique key is the original's with the group and the offset message id of the copy sent
back (``<key>#<group>#<offset msg id>``): a send-back retried after a lost answer is stored once
(the dedup table), while the next failure's send-back, of another stored copy, is a new message,
and so is another group's send-back of the same message (each group that fails it gets its own
copy; the key without the group made the second group's a duplicate, and its retry was lost). The reconsume
count lives only in the replicated message, so a new leader continues the count where the old one
left it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.features.delay.model import DELAY, REAL_QID, REAL_TOPIC, TIMER_PROPERTIES
from protocol.broker_kinds import message_id
from protocol.consume_rules import (
    DEFAULT_MAX_RECONSUME_TIMES,
    dlq_topic,
    retry_topic,
)
from protocol.int_property import natural

RETRY_TOPIC = "RETRY_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
RECONSUME_TIME = "RECONSUME_TIME"
UNIQ_KEY = "UNIQ_KEY"
FIRST_RETRY_LEVEL = 3  # RocketMQ's: the first retry waits level 3 (10 s)
RETRY_QUEUES = 1  # RocketMQ's retryQueueNums
# Seeded bug (tests only): "retry_count_lost" loses the reconsume count of a sent-back message.
RETRY_CANARIES = frozenset({"retry_count_lost"})
DLQ_QUEUES = 1
_DROPPED = frozenset({*TIMER_PROPERTIES, REAL_TOPIC, REAL_QID})


def reconsume_times(props: list[Any] | tuple[Any, ...]) -> int:
    """A stored message's ``RECONSUME_TIME`` (0 for an original, or a malformed value)."""
    for name, value in props:
        if name == RECONSUME_TIME:
            return natural(value, 9) or 0
    return 0


@dataclass(frozen=True, slots=True)
class SendBack:
    topic: str  # %RETRY%<group> or %DLQ%<group>
    message: list[Any]  # entry form; delayed by its DELAY property when retried
    reconsume_times: int  # the copy's RECONSUME_TIME
    dead: bool  # True: into the dead-letter queue


def send_back(group: str, m: list[Any], topic: str, offset_msg_id: str, delay_level: int,
              max_reconsume_times: int) -> SendBack:
    """The copy of stored message ``m`` (entry form; it was read from ``topic``, as
    ``offset_msg_id``) a failed consumption of ``group`` sends back. ``delay_level`` 0: the
    broker's choice (3 + reconsume times); -1: straight to the dead-letter queue."""
    body, tags, keys, unique_key, props, born = m
    times = reconsume_times(props)
    dead = delay_level < 0 or times >= max_reconsume_times
    given = {p[0]: p[1] for p in props}
    kept = [[n, v] for n, v in props if n not in _DROPPED and n != RECONSUME_TIME]
    if RETRY_TOPIC not in given:
        kept.append([RETRY_TOPIC, topic])
    if ORIGIN_MESSAGE_ID not in given:
        kept.append([ORIGIN_MESSAGE_ID, offset_msg_id])
    original_key = message_id(unique_key, props)
    if UNIQ_KEY not in given and unique_key:
        kept.append([UNIQ_KEY, original_key])
    count = times if dead else times + 1
    kept.append([RECONSUME_TIME, str(count)])
    if not dead:
        kept.append([DELAY, str(delay_level or FIRST_RETRY_LEVEL + times)])
    key = f"{original_key}#{group}#{offset_msg_id}"
    return SendBack(dlq_topic(group) if dead else retry_topic(group),
                    [body, tags, keys, key, kept, born], count, dead)


def resent_from_dlq(m: list[Any], offset_msg_id: str) -> list[Any]:
    """A dead letter (stored as ``offset_msg_id``) copied for ``dledger dlq resend``: into
    ``%RETRY%<group>`` at once, its reconsume count back to 0 (the group consumes it afresh),
    stored once however often the resend is retried within the dedup window."""
    body, tags, keys, unique_key, props, born = m
    kept = [[n, v] for n, v in props if n not in _DROPPED and n != RECONSUME_TIME]
    kept.append([RECONSUME_TIME, "0"])
    return [body, tags, keys, f"{message_id(unique_key, props)}#{offset_msg_id}", kept, born]


__all__ = ["DEFAULT_MAX_RECONSUME_TIMES", "SendBack", "dlq_topic", "reconsume_times",
           "resent_from_dlq", "retry_topic", "send_back"]
