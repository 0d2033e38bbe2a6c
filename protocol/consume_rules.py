"""Consumption rules a client and a broker must agree on (RocketMQ's): the retry and dead-letter
topics of a consumer group, how many times a message is reconsumed before it is dead, the
timing of orderly consumers' queue locks, and the property naming an ordered message's group.
Constants and names only; the broker's rules that act on them are ``broker.features.retry``,
``broker.features.orderly`` and ``broker.features.pop``."""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_RECONSUME_TIMES", "DLQ_PREFIX", "LOCK_LEASE_S", "LOCK_RENEW_S", "LOCK_TTL_MS",
           "MAX_RECONSUME_TIMES_LIMIT", "MESSAGE_GROUP_PROPERTY", "RETRY_PREFIX", "dlq_topic",
           "retry_topic"]

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
DEFAULT_MAX_RECONSUME_TIMES = 16
MAX_RECONSUME_TIMES_LIMIT = 10_000

LOCK_TTL_MS = 60_000  # RocketMQ's REBALANCE_LOCK_MAX_LIVE_TIME on the broker
LOCK_RENEW_S = 20.0  # RocketMQ's lock renewal period
LOCK_LEASE_S = 30.0  # how long after sending a lock request the client may rely on it

# RocketMQ's sharding key: a FIFO message's group. A pop consumer (RocketMQ 5's, at the gRPC
# endpoint) gets a group's messages one at a time, in order (``broker.features.pop.model``).
MESSAGE_GROUP_PROPERTY = "__SHARDINGKEY"


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group
