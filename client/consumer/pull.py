"""The pull consumer: the caller chooses queues and offsets; fetch, seek, commit. Pulls go to the
group's leader when known, else to any node (every replica holds only committed messages), with
long polling on the broker. Offsets are committed to the broker, through its replicated log."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from client import errors
from client.cluster.routes import GroupRoute, Routes, client_error
from client.errors import compile_filter
from client.lifecycle import Lifecycle
from client.types import MessageQueue, PullResult, ReceivedMessage
from protocol import broker_kinds as bp
from protocol.auth import Credentials
from protocol.errors import DLedgerError
from protocol.group_client import GroupClient

ROUTE_RETRY_MAX_S = 1.0  # the longest back-off between two route questions of one call


class PullConsumer:
    """``canaries``: seeded bugs for the chaos suite (``client.cluster.routes.CANARIES``), tests only.
    ``tls_ca``: the CA file of a cluster that speaks TLS (else ``DLEDGER_TLS_CA``)."""

    def __init__(self, namesrv: str | Sequence[str], group: str, timeout_s: float = 3.0, *,
                 canaries: Sequence[str] = (), credentials: Credentials | None = None,
                 tls_ca: str | None = None) -> None:
        self._namesrv = [namesrv] if isinstance(namesrv, str) else list(namesrv)
        self.group = group
        self.timeout_s = timeout_s
        self._life = Lifecycle(f"PullConsumer of group {group!r}")
        self._routes = Routes(self._namesrv, canaries=canaries, credentials=credentials,
                              tls_ca=tls_ca)

    async def start(self) -> PullConsumer:
        """Connect (fails fast when no NameServer answers); a second start() does nothing."""
        await self._life.start(self._routes.start)
        return self

    async def close(self) -> None:
        """Release the connections; later calls raise ``ClientClosedError``."""
        if self._life.close():
            await self._routes.close()

    async def __aenter__(self) -> PullConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def fetch_queues(self, topic: str, wait: bool = True) -> list[MessageQueue]:
        """The readable queues of a topic, over every group that serves it. A topic created a
        moment ago shows up once its leader registers it (at once, but asynchronously): this
        waits for that up to the consumer's timeout (``wait=False``: asks once)."""
        self._life.check()
        route = await self._route_until(topic, time.monotonic() + (self.timeout_s if wait else 0),
                                        bool, refresh=True)
        if not route:
            raise errors.TopicNotFoundError(f"no group serves {topic!r}")
        return sorted(MessageQueue(topic, g.group, q) for g in route if g.perm & 4
                      for q in range(g.read_queues))

    async def pull(self, mq: MessageQueue, offset: int, max_messages: int = 32,
                   suspend_ms: int = 0, tags: Sequence[str] = ("*",),
                   max_bytes: int = 4 << 20, sql: str | None = None) -> PullResult:
        """Messages of ``mq`` from ``offset``; with ``suspend_ms`` the broker holds the request
        until a message is committed or the time is up (long polling). ``tags`` or ``sql`` (an
        SQL92 expression over the messages' properties and TAGS, RocketMQ's
        ``MessageSelector.bySql``, evaluated at the broker) filter; the offsets of messages
        filtered out are passed all the same (``next_offset``). A malformed ``sql`` raises
        ``BadFilterError`` before anything is sent."""
        timeout_s = self.timeout_s + suspend_ms / 1000
        if sql is not None:
            if "*" not in tags:
                raise ValueError("a pull filters by tags or by sql, not both")
            compile_filter(sql)
            res = await self._call(mq, bp.PULL_SQL, mq.topic, mq.queue_id, offset, max_messages,
                                   max_bytes, suspend_ms, sql, timeout_s=timeout_s)
        else:
            res = await self._call(mq, bp.PULL, mq.topic, mq.queue_id, offset, max_messages,
                                   max_bytes, suspend_ms, list(tags), timeout_s=timeout_s)
        status, nxt, lo, hi, rows = res
        wanted = set(tags) if "*" not in tags else None
        msgs = tuple(_message(mq, r) for r in rows)
        if wanted is not None:  # the broker filtered by tag hash; the exact check is ours
            msgs = tuple(m for m in msgs if m.tags in wanted)
        return PullResult(status, nxt, lo, hi, msgs)

    async def offset_for_timestamp(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The first offset of ``mq`` stored at or after ``timestamp_ms`` (milliseconds since the
        epoch); the queue's max offset when nothing is that recent."""
        return int(await self._call(mq, bp.SEARCH_OFFSET, mq.topic, mq.queue_id, int(timestamp_ms)))

    async def commit(self, mq: MessageQueue, offset: int) -> None:
        """Store this group's progress on ``mq`` (the next offset to consume)."""
        await self._call(mq, bp.OFFSET_COMMIT, self.group, mq.topic, mq.queue_id, offset,
                         leader=True)

    async def send_back(self, mq: MessageQueue, offset: int, delay_level: int = 0,
                        max_reconsume_times: int = 16) -> tuple[str, int, bool]:
        """Hand a message this group failed back to the broker (RocketMQ's send-back): it comes
        again from ``%RETRY%<group>`` after the delay of ``delay_level`` (0: the broker's
        choice, 3 + reconsume times), or goes to ``%DLQ%<group>`` once reconsumed
        ``max_reconsume_times`` times (or with level -1). Returns (its topic now, its
        reconsume times, whether it is a dead letter)."""
        _, topic, times, dead = await self._call(mq, bp.SEND_BACK, self.group, mq.topic,
                                                 mq.queue_id, offset, delay_level,
                                                 max_reconsume_times, leader=True)
        return str(topic), int(times), bool(dead)

    async def resend_dead_letter(self, mq: MessageQueue, offset: int) -> str:
        """Put the dead letter at ``offset`` of ``mq`` (a queue of ``%DLQ%<this group>``) back
        into ``%RETRY%<this group>``, its reconsume count reset; returns the retry topic."""
        if mq.topic != "%DLQ%" + self.group:
            raise ValueError(f"{mq.topic!r} is not the dead-letter topic of group {self.group!r}")
        _, topic = await self._call(mq, bp.DLQ_RESEND, self.group, offset, leader=True)
        return str(topic)

    async def committed(self, mq: MessageQueue) -> int:
        """The group's committed offset on ``mq``, or -1 if it never committed one. Asked of the
        leader: a follower may not have applied the latest commit yet."""
        return int(await self._call(mq, bp.OFFSET_QUERY, self.group, mq.topic, mq.queue_id,
                                    leader=True))

    async def groups(self, topic: str) -> list[GroupRoute]:
        """The groups that serve ``topic`` (empty if none does yet)."""
        self._life.check()
        return list(await self._route(topic))

    def group_client(self, group: GroupRoute) -> GroupClient:
        """The connection pool to one group's nodes (it follows leader redirects)."""
        self._life.check()
        return self._routes.group_client(group)

    async def _route(self, topic: str, refresh: bool = False) -> tuple[GroupRoute, ...]:
        route = await self._routes.route(topic, refresh=refresh)
        return route.groups if route.exists else ()

    async def _route_until(self, topic: str, deadline: float,
                           enough: Callable[[tuple[GroupRoute, ...]], bool],
                           refresh: bool = False) -> tuple[GroupRoute, ...]:
        """The topic's groups, asked again of the NameServer with a growing back-off until
        ``enough`` holds or the deadline comes: a topic that was just auto-created by its first
        send is registered at once, but asynchronously, so its route shows up a moment later."""
        groups = await self._route(topic, refresh=refresh)
        delay_s = 0.05
        while not enough(groups) and time.monotonic() + delay_s < deadline:
            await asyncio.sleep(delay_s)  # the back-off between two questions to the NameServer
            delay_s = min(ROUTE_RETRY_MAX_S, 2 * delay_s)
            groups = await self._route(topic, refresh=True)
        return groups

    async def _call(self, mq: MessageQueue, kind: int, *args: Any, leader: bool = False,
                    timeout_s: float | None = None) -> Any:
        self._life.check()
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        groups = await self._route_until(mq.topic, deadline,
                                         lambda gs: any(g.group == mq.group for g in gs))
        group = next((g for g in groups if g.group == mq.group), None)
        if group is None:
            raise errors.TopicNotFoundError(f"group {mq.group} does not serve {mq.topic!r}")
        for attempt in range(2):  # a second try with a fresh route (the leader may be new to it)
            client = self._routes.group_client(group)
            try:
                if leader or client.leader in client.nodes:
                    return (await client.call_leader(
                        kind, *args, timeout_s=max(0.05, deadline - time.monotonic())))[1]
                # any replica serves committed reads: the first that is not known to be silent
                return await client.call(client.candidates()[0], kind, *args,
                                         timeout_s=max(0.05, deadline - time.monotonic()))
            except DLedgerError as err:
                self._routes.invalidate(mq.topic)
                mapped = client_error(err)
                if attempt or not isinstance(mapped, errors.RetriableError) \
                        or time.monotonic() >= deadline:
                    raise mapped from err
                fresh = [g for g in await self._route(mq.topic, refresh=True) if g.group == mq.group]
                group = fresh[0] if fresh else group
        raise errors.UnavailableError(f"{mq}: no answer")


def _message(mq: MessageQueue, r: list[Any]) -> ReceivedMessage:
    offset, body, tags, keys, unique_key, props, born, stored, offset_id = r
    if not props:  # the common message: none of a retry's properties to read
        return ReceivedMessage(mq, offset, body, tags, tuple(keys), unique_key, offset_id, (),
                               born, stored, mq.topic)
    pairs = tuple((k, v) for k, v in props)
    named = dict(pairs)
    times = named.get("RECONSUME_TIME", "0")
    return ReceivedMessage(mq, offset, body, tags, tuple(keys), named.get("UNIQ_KEY", unique_key),
                           offset_id, pairs, born, stored, named.get("RETRY_TOPIC", mq.topic),
                           int(times) if times.isdigit() else 0)
