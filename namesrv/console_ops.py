"""The console's reads and actions on the cluster, as a client of it: the client library's
``Routes``, ``PullConsumer`` and ``MessageQuery`` (the calls ``dledger topic``, ``consumer``,
``message`` and ``leader`` make), pointed at this NameServer's own address. No protocol of its
own: every request is one the CLI sends too.

Owns those clients (started on first use, closed by ``close()``), the bounds on one view (topics
and queues shown, pulls at once, a deadline per operation) and the queue rates
(``console_model.RateTracker``). Input is already validated (``console_model``); what the
cluster refuses arrives as the client library's named errors, or as this NameServer's
``ConsoleNotFoundError`` / ``ConsoleConflictError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from client import ClientError, MessageQuery, MessageQueue, PullConsumer
from client.cluster import ask_consumer
from client.cluster.admin_views import consumer_views, summarize_consumers, topic_rows
from client.cluster.routes import GroupRoute, Routes, client_error
from namesrv.console_model import (
    ConsumeDirectlyAction,
    MessageSearch,
    RateTracker,
    ResetAction,
    TopicAction,
    TransferAction,
    message_json,
)
from namesrv.errors import ConsoleConflictError, ConsoleNotFoundError
from protocol import broker_kinds as bp
from protocol.auth import Credentials
from protocol.broker_kinds import RESET_EARLIEST_MS, RESET_LATEST_MS
from protocol.errors import DLedgerError
from protocol.group_client import GroupClient

__all__ = ["OP_TIMEOUT_S", "ConsoleOps"]

T = TypeVar("T")
OP_TIMEOUT_S = 15.0  # one page's read or one action, retries and redirects included
REQUEST_TIMEOUT_S = 3.0  # one request to one node
TRANSFER_TIMEOUT_S = 10.0
PULLS_AT_ONCE = 8
TOPICS_SHOWN_MAX = 256
QUEUES_SHOWN_MAX = 2048
CONSOLE_GROUP = "dledger-console"  # the consumer group name of the console's reads (no commits)
RETRY_PREFIX, DLQ_PREFIX = "%RETRY%", "%DLQ%"
Clock = Callable[[], float]
ClusterView = Callable[[], list[dict[str, Any]]]


async def _bounded(work: Awaitable[T]) -> T:
    async with asyncio.timeout(OP_TIMEOUT_S):
        return await work


async def _leader(client: GroupClient, kind: int, *args: Any,
                  timeout_s: float = REQUEST_TIMEOUT_S) -> Any:
    """A request to the group's leader; a transport or broker error as the client library's."""
    try:
        return (await client.call_leader(kind, *args, timeout_s=timeout_s))[1]
    except DLedgerError as err:
        raise client_error(err) from err


class ConsoleOps:
    """``bind(address)`` once (this NameServer's "host:port"), then any read or action."""

    def __init__(self, cluster_view: ClusterView, clock: Clock = time.monotonic,
                 tls_ca: str | None = None) -> None:
        self._tls_ca = tls_ca  # this NameServer serves TLS: its clients dial it with this CA
        self._cluster_view = cluster_view
        self._clock = clock
        self._address: str | None = None
        self._routes: Routes | None = None
        self._consumer: PullConsumer | None = None
        self._query: MessageQuery | None = None
        self._starting = asyncio.Lock()
        self.rates = RateTracker()

    def bind(self, address: str) -> None:
        """Where this NameServer answers; the first address given stays."""
        if self._address is None:
            self._address = address

    async def _clients(self) -> tuple[Routes, PullConsumer, MessageQuery]:
        async with self._starting:
            if self._routes is None or self._consumer is None or self._query is None:
                assert self._address is not None, "bind() first"
                ca = self._tls_ca
                routes = Routes(self._address, request_timeout_s=REQUEST_TIMEOUT_S, tls_ca=ca)
                consumer = PullConsumer(self._address, CONSOLE_GROUP, timeout_s=REQUEST_TIMEOUT_S,
                                        tls_ca=ca)
                query = MessageQuery(self._address, timeout_s=REQUEST_TIMEOUT_S, tls_ca=ca)
                await routes.start()
                await consumer.start()
                await query.start()
                self._routes, self._consumer, self._query = routes, consumer, query
            return self._routes, self._consumer, self._query

    @contextlib.asynccontextmanager
    async def _acting(self, credentials: Credentials | None) -> AsyncIterator[Routes]:
        """The routes an action goes through: the viewer's own, signed with the credentials
        the page sent (a cluster with access control decides what they may do), else the
        console's shared ones (the NameServer process's account, if any)."""
        if credentials is None:
            routes, _, _ = await self._clients()
            yield routes
            return
        assert self._address is not None, "bind() first"
        routes = Routes(self._address, request_timeout_s=REQUEST_TIMEOUT_S, tls_ca=self._tls_ca,
                        credentials=credentials)
        await routes.start()
        try:
            yield routes
        finally:
            await routes.close()

    async def close(self) -> None:
        routes, consumer, query = self._routes, self._consumer, self._query
        self._routes = self._consumer = self._query = None
        for c in (routes, consumer, query):
            if c is not None:
                await c.close()

    # -- reads --------------------------------------------------------------------------------

    async def topics(self, only: str | None = None) -> dict[str, Any]:
        """Every topic (or ``only``) with each queue's min and max offset and message rate."""
        _, consumer, _ = await self._clients()
        rows = topic_rows(self._cluster_view(), only)
        if only is not None and not rows:
            raise ConsoleNotFoundError(f"no broker group serves topic {only!r}")
        shown = rows[:TOPICS_SHOWN_MAX]
        queues = [(row["topic"], group, cfg, qid) for row in shown
                  for group, cfg in row["groups"].items()
                  for qid in range(cfg["read_queues"] if cfg["perm"] & 4 else 0)]
        limit = asyncio.Semaphore(PULLS_AT_ONCE)

        async def one(name: str, group: str, qid: int) -> dict[str, Any]:
            async with limit:
                try:
                    r = await consumer.pull(MessageQueue(name, group, qid), 0, 0)
                except ClientError as err:  # one queue's failure is its row, not the page's
                    return {"queue": f"{group}/{qid}", "error": f"{type(err).__name__}: {err}"}
            rate = self.rates.sample((name, group, qid), r.max_offset, self._clock())
            return {"queue": f"{group}/{qid}", "min": r.min_offset, "max": r.max_offset,
                    "rate": rate}
        answers = await _bounded(asyncio.gather(*(one(n, g, q) for n, g, _, q in
                                                  queues[:QUEUES_SHOWN_MAX])))
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (name, *_), answer in zip(queues, answers):
            by_topic.setdefault(name, []).append(answer)
        out = []
        for row in shown:
            qs = by_topic.get(row["topic"], [])
            rates = [q["rate"] for q in qs if q.get("rate") is not None]
            out.append({**row, "queues": qs,
                        "messages": sum(q["max"] - q["min"] for q in qs if "max" in q),
                        "rate": sum(rates) if rates else None})
        return {"topics": out, "topics_total": len(rows),
                "queues_cut": len(queues) > QUEUES_SHOWN_MAX}

    def consumer_group_names(self, from_nodes: list[str]) -> list[str]:
        """Groups with live members or committed offsets (as the nodes' statuses said), or
        retry / dead-letter topics."""
        names = set(from_nodes)
        for g in self._cluster_view():
            for topic in g["topics"]:
                for prefix in (RETRY_PREFIX, DLQ_PREFIX):
                    if topic.startswith(prefix):
                        names.add(topic[len(prefix):])
        return sorted(names)

    async def consumer_group(self, group: str) -> dict[str, Any]:
        """Members, per-queue lag, and the group's retries and dead letters."""
        routes, consumer, _ = await self._clients()
        groups = await _bounded(routes.cluster_groups())
        views = await _bounded(asyncio.gather(*(consumer_views(routes, g, group,
                                                               REQUEST_TIMEOUT_S)
                                                for g in groups)))
        report = summarize_consumers(group, [v for vs in views for v in vs])
        committed = {(r["topic"], r["queue"]): r["committed"] for r in report["queues"]}
        for key, prefix in (("retry", RETRY_PREFIX), ("dlq", DLQ_PREFIX)):
            report[key] = await _bounded(self._held(consumer, prefix + group, committed))
        return report

    async def _held(self, consumer: PullConsumer, topic: str,
                    committed: dict[tuple[str, str], int]) -> dict[str, Any] | None:
        """A retry or dead-letter topic's messages held and those the group has not consumed
        yet (by its committed offsets); None when the topic does not exist (nothing was ever
        sent back)."""
        if not any(topic in g["topics"] for g in self._cluster_view()):
            return None
        held = pending = 0
        for mq in await consumer.fetch_queues(topic, wait=False):
            r = await consumer.pull(mq, 0, 0)
            done = committed.get((topic, f"{mq.group}/{mq.queue_id}"), -1)
            held += r.max_offset - r.min_offset
            pending += max(0, r.max_offset - max(done, r.min_offset))
        return {"topic": topic, "messages": held, "pending": pending}

    async def search(self, s: MessageSearch) -> list[dict[str, Any]]:
        _, consumer, query = await self._clients()
        if s.by == "msg_id":
            return [await self.view(s.msg_id)]
        if s.by == "unique_key":
            found = await _bounded(query.by_unique_key(s.msg_id, s.topic or None))
            return [message_json(m) for m in found]
        if s.by == "key":
            found = await _bounded(query.by_key(s.topic, s.key, s.begin_ms, s.end_ms))
            return [message_json(m) for m in found]
        mq = MessageQueue(s.topic, s.broker_group, s.queue_id)
        res = await _bounded(consumer.pull(mq, s.offset, s.count))
        return [message_json(m) for m in res.messages]

    async def view(self, offset_msg_id: str) -> dict[str, Any]:
        _, _, query = await self._clients()
        try:
            return message_json(await _bounded(query.view(offset_msg_id)))
        except ValueError as err:  # a malformed id: the library names it
            raise ConsoleNotFoundError(str(err)) from err

    # -- actions ------------------------------------------------------------------------------

    async def _groups(self, routes: Routes, only: tuple[str, ...]) -> list[GroupRoute]:
        groups = await routes.cluster_groups()
        unknown = sorted(set(only) - {g.group for g in groups})
        if not groups:
            raise ConsoleNotFoundError("no broker group is registered at this NameServer")
        if unknown:
            raise ConsoleNotFoundError(f"no broker group {', '.join(unknown)} is registered "
                                       f"(registered: {', '.join(g.group for g in groups)})")
        return [g for g in groups if not only or g.group in only]

    async def put_topic(self, a: TopicAction,
                        credentials: Credentials | None = None) -> list[dict[str, Any]]:
        """TOPIC_PUT on each group's leader: the given counts (create), or the group's current
        config with the given fields changed (update; a group without the topic: 404)."""
        async with self._acting(credentials) as routes:
            return await self._put_topic(routes, a)

    async def _put_topic(self, routes: Routes, a: TopicAction) -> list[dict[str, Any]]:
        async def put() -> list[dict[str, Any]]:
            done = []
            for g in await self._groups(routes, a.groups):
                client = routes.group_client(g)
                new = {"read_queues": a.read_queues, "write_queues": a.write_queues,
                       "perm": a.perm}
                if a.mode == "update":
                    current = (await _leader(client, bp.BROKER_STATUS))["topics"].get(a.name)
                    if current is None:
                        raise ConsoleNotFoundError(f"group {g.group} has no topic {a.name!r} "
                                                   f"(create makes one)")
                    new = {k: current[k] if v is None else v for k, v in new.items()}
                res = await _leader(client, bp.TOPIC_PUT, a.name, new["read_queues"],
                                    new["write_queues"], new["perm"])
                done.append({"group": g.group, "result": str(res), **new})
            return done
        return await _bounded(put())

    async def transfer(self, a: TransferAction,
                       credentials: Credentials | None = None) -> dict[str, Any]:
        async with self._acting(credentials) as routes:
            return await self._transfer(routes, a)

    async def _transfer(self, routes: Routes, a: TransferAction) -> dict[str, Any]:
        async def move() -> dict[str, Any]:
            (g,) = await self._groups(routes, (a.group,))
            if a.to not in g.nodes:
                raise ConsoleNotFoundError(f"group {g.group} has no registered node {a.to!r} "
                                           f"(registered: {', '.join(sorted(g.nodes))})")
            client = routes.group_client(g)
            try:
                node, _ = await client.call_leader(bp.TRANSFER_LEADERSHIP, a.to,
                                                   timeout_s=TRANSFER_TIMEOUT_S)
            except DLedgerError as err:
                raise client_error(err) from err
            return {"group": g.group, "from": node, "to": a.to}
        return await _bounded(move())

    async def reset(self, a: ResetAction,
                    credentials: Credentials | None = None) -> list[dict[str, Any]]:
        """OFFSET_RESET on each group serving the topic; refused (409) while live members of the
        consumer group subscribe to it, unless ``force``."""
        async with self._acting(credentials) as routes:
            return await self._reset(routes, a)

    async def _reset(self, routes: Routes, a: ResetAction) -> list[dict[str, Any]]:
        timestamp_ms = {"earliest": RESET_EARLIEST_MS, "latest": RESET_LATEST_MS}.get(
            a.to, a.timestamp_ms)

        async def reset() -> list[dict[str, Any]]:
            route = await routes.route(a.topic, refresh=True)
            if not route.exists or not route.groups:
                raise ConsoleNotFoundError(f"no broker group serves topic {a.topic!r}")
            if not a.force:  # refuse before any group resets, rather than halfway through
                for g in route.groups:
                    st = await _leader(routes.group_client(g), bp.CONSUMER_STATUS,
                                       a.consumer_group)
                    live = [m["client_id"] for m in st["members"]
                            if a.topic in m["subscriptions"]]
                    if live:
                        raise ConsoleConflictError(
                            f"consumer group {a.consumer_group!r} has {len(live)} live "
                            f"member(s) on {a.topic} ({', '.join(live)}): they would overwrite "
                            f"the reset; stop them first, or force it")
            rows = []
            for g in sorted(route.groups, key=lambda g: g.group):
                for qid, old, new in await _leader(routes.group_client(g), bp.OFFSET_RESET,
                                                   a.consumer_group, a.topic, timestamp_ms,
                                                   a.force):
                    rows.append({"queue": f"{g.group}/{qid}", "before": old, "after": new})
            return rows
        return await _bounded(reset())

    async def consume_directly(self, a: ConsumeDirectlyAction,
                               credentials: Credentials | None = None) -> dict[str, Any]:
        """The consumer consumes the message once more, through a node it is connected to
        (``client.cluster.ask_consumer``): its result."""
        async with self._acting(credentials) as routes:
            return await _bounded(ask_consumer.consume_directly(
                routes, a.consumer_group, a.client_id, a.offset_msg_id))
