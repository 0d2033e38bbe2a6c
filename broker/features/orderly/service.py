"""The leader's side of queue locks (``broker.features.orderly.model``): LOCK_BATCH and UNLOCK_BATCH requests
become ``LockQueues`` entries, answered once applied with the queues the state machine granted.
Owns nothing replicated.

The canary ``lock_leader_local`` keeps the locks in the leader's memory instead, RocketMQ's own
design (its broker's lock manager is per process): after a leader change the new leader knows
no lock and grants a queue still held, which the orderly checker must catch.
"""

from __future__ import annotations

import time

from broker.features.host import BrokerHost
from broker.features.orderly.entries import LockQueues
from broker.features.orderly.model import LockTable
from protocol.consume_rules import LOCK_TTL_MS


class LockService:
    def __init__(self, host: BrokerHost) -> None:
        self.host = host
        self._leader_local = "lock_leader_local" in host.config.canaries
        self._local = LockTable()
        self._local_term = -1

    async def lock(self, group: str, client_id: str,
                   queues: list[tuple[str, int]]) -> list[list[object]]:
        self.host.require_leader()
        now_ms = int(time.time() * 1000)
        if self._leader_local:
            core = self.host.node.core
            term = core.term if core is not None else 0
            if term != self._local_term:  # a new leader starts with an empty table
                self._local, self._local_term = LockTable(), term
            return [list(q) for q in self._local.lock(group, client_id, queues, now_ms)]
        result = await self.host.leader_commit(
            LockQueues(now_ms, group, client_id, tuple(queues), True, LOCK_TTL_MS))
        return [list(q) for q in result.granted]

    async def unlock(self, group: str, client_id: str, queues: list[tuple[str, int]]) -> bool:
        self.host.require_leader()
        now_ms = int(time.time() * 1000)
        if self._leader_local:
            self._local.unlock(group, client_id, queues, now_ms)
            return True
        await self.host.leader_commit(
            LockQueues(now_ms, group, client_id, tuple(queues), False, 0))
        return True
