"""Message query (RocketMQ's ``queryMessage`` / ``viewMessage``): a stored message by its offset
msg id, by its unique key (the client msg id a ``SendResult`` names), by one of its keys within
a store-time range, or every message of a topic within a store-time range (no key), with where
it is stored and which consumer groups have consumed it.

A query by key or by time fans out to every broker group of the cluster (a topic's queues may live in
several) and merges the answers, newest first; a query by offset msg id asks the group the id
names. Within a group the leader is asked first, any other replica if it does not answer: every
replica holds the same key index, but one that lags its leader may not have the newest messages
yet (a message a moment old may be missing from a follower's answer).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from client import errors
from client.cluster.routes import GroupRoute, Routes, client_error
from client.lifecycle import Lifecycle
from client.sync import _LoopThread
from protocol import broker_kinds as bp
from protocol.auth import Credentials
from protocol.errors import DLedgerError, ProposalTimeoutError

QUERY_MAX_MESSAGES = 1024  # the broker's bound on one answer


@dataclass(frozen=True, slots=True)
class FoundMessage:
    """A stored message as a query finds it. ``consumed_by``: the consumer groups whose
    committed offset on its queue is past it (a group that consumed it but has not committed
    yet is not among them)."""

    offset_msg_id: str
    group: str
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    tags: str
    keys: tuple[str, ...]
    unique_key: str  # as its sender gave it (the msg_id), without the broker's content digest
    properties: tuple[tuple[str, str], ...]
    born_ts_ms: int
    store_ts_ms: int
    consumed_by: tuple[str, ...]


def _found(row: list[Any]) -> FoundMessage:
    (msg_id, group, topic, qid, offset, body, tags, keys, unique_key, props, born, stored,
     consumed) = row
    return FoundMessage(str(msg_id), str(group), str(topic), int(qid), int(offset), bytes(body),
                        str(tags), tuple(keys), bp.message_id(str(unique_key), props),
                        tuple((k, v) for k, v in props),
                        int(born), int(stored), tuple(consumed))


def _checked(begin_ms: int, end_ms: int | None, max_messages: int) -> int:
    """A query's range and bound checked before it is sent (the broker checks them too): the
    end (``None``: the end of time)."""
    if not 1 <= max_messages <= QUERY_MAX_MESSAGES:
        raise ValueError(f"max_messages must be 1..{QUERY_MAX_MESSAGES}, not {max_messages}")
    end = bp.INT_MAX if end_ms is None else int(end_ms)
    if not 0 <= int(begin_ms) <= end:
        raise ValueError(f"the time range must have 0 <= begin_ms <= end_ms, not {begin_ms} .. "
                         f"{end}")
    return end


def group_of(offset_msg_id: str) -> str:
    """The broker group an offset msg id names (``GROUP-<position hex>-<slot>``)."""
    return bp.parse_offset_msg_id(offset_msg_id)[0]


class MessageQuery:
    """``async with MessageQuery(namesrv) as q: found = await q.view(result.offset_msg_id)``."""

    def __init__(self, namesrv: str | Sequence[str], timeout_s: float = 5.0, *,
                 credentials: Credentials | None = None, tls_ca: str | None = None) -> None:
        self.timeout_s = timeout_s
        self._life = Lifecycle("MessageQuery")
        self._routes = Routes(namesrv, request_timeout_s=min(timeout_s, 3.0),
                              credentials=credentials, tls_ca=tls_ca)

    async def start(self) -> MessageQuery:
        """Connect (fails fast when no NameServer answers); a second start() does nothing."""
        await self._life.start(self._routes.start)
        return self

    async def close(self) -> None:
        if self._life.close():
            await self._routes.close()

    async def __aenter__(self) -> MessageQuery:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def view(self, offset_msg_id: str) -> FoundMessage:
        """The message an offset msg id names; ``MessageNotFoundError`` if none is stored there
        (``ValueError`` if the id is malformed)."""
        group = group_of(offset_msg_id)
        routes = [g for g in await self._groups() if g.group == group]
        if not routes:
            raise errors.MessageNotFoundError(f"{offset_msg_id}: no broker group {group} is "
                                              f"registered")
        return _found(await self._ask(routes[0], bp.VIEW_MESSAGE, offset_msg_id))

    async def by_unique_key(self, unique_key: str, topic: str | None = None) -> list[FoundMessage]:
        """The messages stored with this unique key (in ``topic``, or any), newest first: one,
        unless the dedup window had passed when it was sent again."""
        return await self._fan_out(bp.QUERY_BY_UNIQUE_KEY, unique_key, topic or "",
                                   QUERY_MAX_MESSAGES, limit=QUERY_MAX_MESSAGES)

    async def by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int | None = None,
                     max_messages: int = 64) -> list[FoundMessage]:
        """The messages of ``topic`` with ``key`` among their keys, stored within [begin_ms,
        end_ms] (ms since the epoch; ``None``: now and after), newest first, at most
        ``max_messages`` (1..1024) over every group."""
        end = _checked(begin_ms, end_ms, max_messages)
        return await self._fan_out(bp.QUERY_BY_KEY, topic, key, int(begin_ms), end,
                                   max_messages, limit=max_messages)

    async def by_time(self, topic: str, begin_ms: int = 0, end_ms: int | None = None,
                      max_messages: int = 64) -> list[FoundMessage]:
        """The messages of ``topic`` stored within [begin_ms, end_ms] whatever their keys
        (``queryMessage`` without a key), newest first, at most ``max_messages`` (1..1024) over
        every group; ``ValueError`` if begin_ms is after end_ms."""
        end = _checked(begin_ms, end_ms, max_messages)
        return await self._fan_out(bp.QUERY_BY_TIME, topic, int(begin_ms), end, max_messages,
                                   limit=max_messages)

    async def _groups(self) -> list[GroupRoute]:
        self._life.check()
        groups = await self._routes.cluster_groups()
        if not groups:
            raise errors.UnavailableError("no broker group is registered at the NameServer")
        return groups

    async def _fan_out(self, kind: int, *args: Any, limit: int) -> list[FoundMessage]:
        groups = await self._groups()
        answers = await asyncio.gather(*(self._ask(g, kind, *args) for g in groups))
        found = [_found(row) for rows in answers for row in rows]
        found.sort(key=lambda m: (-m.store_ts_ms, m.offset_msg_id))
        return found[:limit]

    async def _ask(self, group: GroupRoute, kind: int, *args: Any) -> Any:
        """Ask the group's leader, else each other replica in turn, until the deadline."""
        client = self._routes.group_client(group)
        deadline = time.monotonic() + self.timeout_s
        last: errors.ClientError | None = None
        for node in client.candidates():
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                break
            try:
                return await client.call(node, kind, *args, timeout_s=left_s)
            except DLedgerError as err:
                if isinstance(err, ProposalTimeoutError):
                    client.suspect(node)
                mapped = client_error(err)
                if not isinstance(mapped, errors.RetriableError | errors.SendTimeoutError):
                    raise mapped from err
                last = mapped
        raise errors.UnavailableError(f"no node of group {group.group} answered the query: {last}")


class SyncMessageQuery:
    """MessageQuery's blocking twin, started by its constructor (fails fast when no NameServer
    answers); a context manager."""

    def __init__(self, namesrv: str | Sequence[str], timeout_s: float = 5.0, *,
                 credentials: Credentials | None = None) -> None:
        self._lt = _LoopThread("SyncMessageQuery")
        self._q = MessageQuery(namesrv, timeout_s, credentials=credentials)
        self._limit_s = timeout_s + 20
        self._lt.start(self._q.start(), self._limit_s)

    def view(self, offset_msg_id: str) -> FoundMessage:
        return self._lt.run(self._q.view(offset_msg_id), self._limit_s)

    def by_unique_key(self, unique_key: str, topic: str | None = None) -> list[FoundMessage]:
        return self._lt.run(self._q.by_unique_key(unique_key, topic), self._limit_s)

    def by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int | None = None,
               max_messages: int = 64) -> list[FoundMessage]:
        return self._lt.run(self._q.by_key(topic, key, begin_ms, end_ms, max_messages),
                            self._limit_s)

    def by_time(self, topic: str, begin_ms: int = 0, end_ms: int | None = None,
                max_messages: int = 64) -> list[FoundMessage]:
        return self._lt.run(self._q.by_time(topic, begin_ms, end_ms, max_messages),
                            self._limit_s)

    def close(self) -> None:
        self._lt.close(self._q.close(), self._limit_s)

    def __enter__(self) -> SyncMessageQuery:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
