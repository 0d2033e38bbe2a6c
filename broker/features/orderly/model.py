"""Queue locks for orderly consumption, the pure part: which member of a consumer group may
process a queue (RocketMQ's broker-side ``RebalanceLockManager``, here replicated).

A member of a clustering group that consumes orderly locks its queues before it processes
them, renews the locks every ``LOCK_RENEW_S`` (20 s), and unlocks a queue it gives away. A lock
is granted by a log entry (``LockQueues``) and lasts ``LOCK_TTL_MS`` (60 s) of the entries' time
from its last grant; another member gets the queue only once it is released or expired.

Exclusivity across leader changes, the rule: **a lock exists only as replicated state**. A
grant is answered only after its entry is committed and applied, so every lock a client was
told it holds is in the state of every later leader, which therefore refuses the queue to
anyone else until that lock's expiry. Time here is the entries' store time made monotonic
(``clock_ms`` never runs backwards, whatever the next leader's clock says), so a lock never
lasts less than its TTL measured by the clocks of the leaders that follow. The client's side of
the rule (``client.consumer.orderly``): it processes a queue only within ``LOCK_LEASE_S`` (30 s) of
*sending* its last successful lock request, half the TTL, which leaves 30 s for the
difference between the leaders' clocks and the request's time in flight.

Pure and deterministic: applied on every replica from the entries alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from protocol.consume_rules import LOCK_LEASE_S, LOCK_RENEW_S, LOCK_TTL_MS

# Seeded bugs (tests only): "lock_unfenced" grants a queue lock whoever holds it (the apply);
# "lock_leader_local" keeps the locks in the leader's memory (the service).
ORDERLY_CANARIES = frozenset({"lock_unfenced", "lock_leader_local"})

QueueKey = tuple[str, str, int]  # (consumer group, topic, queue id)


class LockTable:
    __slots__ = ("_locks", "clock_ms")

    def __init__(self) -> None:
        self._locks: dict[QueueKey, tuple[str, int]] = {}  # -> (client id, expiry ms)
        self.clock_ms = 0  # the latest entry time seen: lock time never runs backwards

    def __len__(self) -> int:
        return len(self._locks)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LockTable) and self.snapshot() == other.snapshot()

    def tick(self, ts_ms: int) -> int:
        self.clock_ms = max(self.clock_ms, ts_ms)
        return self.clock_ms

    def holder(self, key: QueueKey) -> str | None:
        """The client holding ``key`` at the table's clock, or None."""
        held = self._locks.get(key)
        return held[0] if held is not None and held[1] > self.clock_ms else None

    def lock(self, group: str, client_id: str, queues: Iterable[tuple[str, int]], ts_ms: int,
             ttl_ms: int = LOCK_TTL_MS, fenced: bool = True) -> list[tuple[str, int]]:
        """Grant (or renew) each queue that is free, expired or already ``client_id``'s; the
        queues granted. ``fenced=False`` is the canary: grant whoever holds it."""
        now = self.tick(ts_ms)
        granted = []
        for topic, qid in queues:
            key = (group, topic, qid)
            held = self._locks.get(key)
            if fenced and held is not None and held[0] != client_id and held[1] > now:
                continue
            self._locks[key] = (client_id, now + ttl_ms)
            granted.append((topic, qid))
        self._expire(now)
        return granted

    def unlock(self, group: str, client_id: str, queues: Iterable[tuple[str, int]],
               ts_ms: int) -> None:
        """Release the queues ``client_id`` holds (others' locks are left alone)."""
        self.tick(ts_ms)
        for topic, qid in queues:
            key = (group, topic, qid)
            held = self._locks.get(key)
            if held is not None and held[0] == client_id:
                del self._locks[key]

    def _expire(self, now: int) -> None:
        """Forget locks long expired (bounded memory: a queue locked once is not kept)."""
        if len(self._locks) > 64:
            for key in [k for k, (_, until) in self._locks.items() if until <= now]:
                del self._locks[key]

    def held_by(self, group: str) -> dict[str, list[tuple[str, int]]]:
        """Live locks of ``group``: client id -> its queues (for status)."""
        out: dict[str, list[tuple[str, int]]] = {}
        for (g, topic, qid), (client, until) in sorted(self._locks.items()):
            if g == group and until > self.clock_ms:
                out.setdefault(client, []).append((topic, qid))
        return out

    def snapshot(self) -> list[Any]:
        return [self.clock_ms, sorted([g, t, q, c, u] for (g, t, q), (c, u) in self._locks.items())]

    @classmethod
    def restore(cls, blob: Any) -> LockTable:
        table = cls()
        clock, rows = blob
        if not isinstance(clock, int) or not isinstance(rows, list):
            raise ValueError("malformed lock table")
        table.clock_ms = clock
        for row in rows:
            g, t, q, c, u = row
            if not (isinstance(g, str) and isinstance(t, str) and isinstance(q, int)
                    and isinstance(c, str) and isinstance(u, int)):
                raise ValueError("malformed queue lock")
            table._locks[(g, t, q)] = (c, u)
        return table


__all__ = ["LOCK_LEASE_S", "LOCK_RENEW_S", "LOCK_TTL_MS", "LockTable"]
