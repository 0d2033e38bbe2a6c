"""How a clustering consumer group shares a topic's queues: RocketMQ's allocation strategies as
pure functions of (this client, all clients, all queues). Every member computes the same answer
from the same inputs, so each queue has exactly one consumer without any coordination."""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Callable, Sequence

from client.types import MessageQueue

Strategy = Callable[[str, Sequence[str], Sequence[MessageQueue]], list[MessageQueue]]


def averagely(me: str, clients: Sequence[str], queues: Sequence[MessageQueue]) -> list[MessageQueue]:
    """Contiguous ranges: with 8 queues and 3 clients, 3 + 3 + 2."""
    cs, qs = sorted(clients), sorted(queues)
    if me not in cs or not qs:
        return []
    k, n = cs.index(me), len(cs)
    base, extra = divmod(len(qs), n)
    start = k * base + min(k, extra)
    return qs[start : start + base + (1 if k < extra else 0)]


def by_circle(me: str, clients: Sequence[str], queues: Sequence[MessageQueue]) -> list[MessageQueue]:
    """Round robin: queue i goes to client i mod n."""
    cs, qs = sorted(clients), sorted(queues)
    if me not in cs:
        return []
    k, n = cs.index(me), len(cs)
    return [q for i, q in enumerate(qs) if i % n == k]


def consistent_hash(me: str, clients: Sequence[str], queues: Sequence[MessageQueue],
                    virtual_nodes: int = 16) -> list[MessageQueue]:
    """Each queue goes to the first client clockwise on a hash ring (few moves on membership
    changes)."""
    if me not in clients:
        return []
    ring = sorted((_h(f"{c}#{v}"), c) for c in sorted(set(clients)) for v in range(virtual_nodes))
    points = [p for p, _ in ring]
    out = []
    for q in sorted(queues):
        i = bisect.bisect(points, _h(f"{q.topic}/{q.group}/{q.queue_id}")) % len(ring)
        if ring[i][1] == me:
            out.append(q)
    return out


def _h(text: str) -> int:
    return zlib.crc32(text.encode())


STRATEGIES: dict[str, Strategy] = {"averagely": averagely, "by_circle": by_circle,
                                   "consistent_hash": consistent_hash}
