"""Consumption rules a client and a broker must agree on (RocketMQ's): the retry and dead-letter
topics of a consumer group, how many times a message is reconsumed before it is dead, and the
timing of orderly consumers' queue locks. Constants and names only; the broker's rules that
act on them are ``broker.features.retry`` and ``broker.features.orderly``."""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_RECONSUME_TIMES", "DLQ_PREFIX", "LOCK_LEASE_S", "LOCK_RENEW_S", "LOCK_TTL_MS",
           "MAX_RECONSUME_TIMES_LIMIT", "RETRY_PREFIX", "dlq_topic", "retry_topic"]

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
DEFAULT_MAX_RECONSUME_TIMES = 16
MAX_RECONSUME_TIMES_LIMIT = 10_000

LOCK_TTL_MS = 60_000  # RocketMQ's REBALANCE_LOCK_MAX_LIVE_TIME on the broker
LOCK_RENEW_S = 20.0  # RocketMQ's lock renewal period
LOCK_LEASE_S = 30.0  # how long after sending a lock request the client may rely on it


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group
