"""The log entries of queue locks (``broker.features.orderly.model``): LOCK_QUEUES (kind 7) and
UNLOCK_QUEUES (kind 8), ``[ts, group, client id, [[topic, queue id]...], ttl ms]``, strictly
decoded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.core.codec import as_int, as_pairs, as_str, dump

__all__ = ["KIND_LOCK_QUEUES", "KIND_UNLOCK_QUEUES", "LockQueues", "decode_lock_queues",
           "encode_lock_queues"]

KIND_LOCK_QUEUES = 7
KIND_UNLOCK_QUEUES = 8


@dataclass(frozen=True, slots=True)
class LockQueues:
    """An orderly consumer's lock (or renewal) of queues (``broker.features.orderly.model``);
    ``lock=False``: their release."""

    store_ts_ms: int
    group: str
    client_id: str
    queues: tuple[tuple[str, int], ...]
    lock: bool = True
    ttl_ms: int = 60_000


def encode_lock_queues(e: LockQueues) -> bytes:
    return dump(KIND_LOCK_QUEUES if e.lock else KIND_UNLOCK_QUEUES,
                [e.store_ts_ms, e.group, e.client_id, [list(q) for q in e.queues], e.ttl_ms])


def decode_lock_queues(number: int, f: list[Any]) -> LockQueues:
    ts, group, client_id, queues, ttl_ms = f
    out = tuple((as_str(t), as_int(q)) for t, q in as_pairs(queues, "[topic, queue id]"))
    return LockQueues(as_int(ts), as_str(group), as_str(client_id), out,
                      number == KIND_LOCK_QUEUES, as_int(ttl_ms))
