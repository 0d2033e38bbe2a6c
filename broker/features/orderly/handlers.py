"""The requests of orderly consumers' queue locks: LOCK_BATCH and UNLOCK_BATCH, each field
checked before the lock service (``broker.features.orderly.service``) is called."""

from __future__ import annotations

from typing import Protocol

from broker.core.requests import Handler, handlers, lock_queues, text
from broker.features.orderly.service import LockService
from protocol.broker_kinds import LOCK_BATCH, UNLOCK_BATCH

__all__ = ["HANDLERS", "lock_batch", "unlock_batch"]

HANDLERS: list[Handler] = []
handles = handlers(HANDLERS)


class LockHandlersHost(Protocol):
    @property
    def locks(self) -> LockService: ...


@handles(LOCK_BATCH, group=text(), client_id=text(), queues=lock_queues)
async def lock_batch(broker: LockHandlersHost, group: str, client_id: str,
                     queues: list[tuple[str, int]]) -> list[list[object]]:
    return await broker.locks.lock(group, client_id, queues)


@handles(UNLOCK_BATCH, group=text(), client_id=text(), queues=lock_queues)
async def unlock_batch(broker: LockHandlersHost, group: str, client_id: str,
                       queues: list[tuple[str, int]]) -> bool:
    return await broker.locks.unlock(group, client_id, queues)
