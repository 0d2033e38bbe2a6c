"""The console's live cluster view: a loop that, while at least one browser is subscribed, asks
every registered node's admin ``/status`` about every ``POLL_INTERVAL_S`` and hands each
subscriber the resulting snapshot (the newest only: a slow browser skips snapshots, it never
queues them).

Owns the loop, its one shared ``aiohttp.ClientSession`` (each request bounded by
``NODE_TIMEOUT_S``, at most ``CONCURRENCY`` at once) and the subscriber set (at most
``SUBSCRIBERS_MAX``). The registrations come from the NameServer's own registry (a callable, so
this module has no registry and no clock of its own); the per-group merge of node answers is
``client.cluster.admin_views.group_status``, the same that ``dledger status`` prints. A node that does not
answer is a row saying so, with the error. ``close()`` stops the loop and ends every
subscription; nothing here outlives the app.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import aiohttp

from client.cluster.admin_views import group_status

if TYPE_CHECKING:
    import ssl

__all__ = ["ClusterPoller", "ConsoleBusyError", "Subscription"]

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5
NODE_TIMEOUT_S = 1.0
CONCURRENCY = 16
SUBSCRIBERS_MAX = 64
ClusterView = Callable[[], list[dict[str, Any]]]


class ConsoleBusyError(Exception):
    """Already ``SUBSCRIBERS_MAX`` live views open (503)."""


class Subscription:
    """One browser's feed: ``await next(timeout_s)`` is the newest snapshot not yet taken, None
    when the time is up first; ``closed`` once the poller closed."""

    def __init__(self) -> None:
        self._box: asyncio.Queue[bytes] = asyncio.Queue(maxsize=1)
        self.closed = False

    def offer(self, snapshot: bytes) -> None:
        if self._box.full():
            self._box.get_nowait()  # not taken yet: replaced by the newer one
        self._box.put_nowait(snapshot)

    def close(self) -> None:
        self.closed = True
        if self._box.full():
            self._box.get_nowait()
        self._box.put_nowait(b"")  # wakes a waiting next()

    async def next(self, timeout_s: float) -> bytes | None:
        try:
            got = await asyncio.wait_for(self._box.get(), timeout_s)
        except TimeoutError:
            return None
        return None if self.closed else got


class ClusterPoller:
    def __init__(self, cluster_view: ClusterView, interval_s: float = POLL_INTERVAL_S,
                 node_timeout_s: float = NODE_TIMEOUT_S, concurrency: int = CONCURRENCY,
                 subscribers_max: int = SUBSCRIBERS_MAX,
                 ssl_context: ssl.SSLContext | None = None,
                 status_key: bytes | None = None) -> None:
        self._ssl = ssl_context  # the brokers' admin endpoints over TLS (https), if given
        self._status_key = status_key  # signs each /status read (brokers' --protect-status)
        if interval_s <= 0 or node_timeout_s <= 0 or concurrency < 1 or subscribers_max < 1:
            raise ValueError("interval_s, node_timeout_s, concurrency and subscribers_max must "
                             "be positive")
        self._cluster_view = cluster_view
        self.interval_s = interval_s
        self.node_timeout_s = node_timeout_s
        self.concurrency = concurrency
        self.subscribers_max = subscribers_max
        self._subscribers: set[Subscription] = set()
        self._session: aiohttp.ClientSession | None = None
        self._limit: asyncio.Semaphore | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._seq = 0
        self.latest: dict[str, Any] | None = None

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[Subscription]:
        """A feed of snapshots for as long as the block runs; the loop runs while any is open."""
        if self._closed:
            raise ConsoleBusyError("the console is shutting down")
        if len(self._subscribers) >= self.subscribers_max:
            raise ConsoleBusyError(f"already {self.subscribers_max} live views open")
        sub = Subscription()
        self._subscribers.add(sub)
        if self.latest is not None:
            sub.offer(_encode(self.latest))  # the page has something to show at once
        if not self.running:
            self._task = asyncio.create_task(self._run(), name="console-cluster-poll")
        try:
            yield sub
        finally:
            self._subscribers.discard(sub)

    async def snapshot(self) -> dict[str, Any]:
        """Ask every node now (also without subscribers): the cluster as it is."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.node_timeout_s),
                connector=aiohttp.TCPConnector(ssl=self._ssl or True))
            self._limit = asyncio.Semaphore(self.concurrency)
        session = self._session
        groups = self._cluster_view()
        started_s = time.monotonic()
        scheme = "https" if self._ssl is not None else "http"
        rows = await asyncio.gather(*(group_status(session, g, self._limit, scheme=scheme,
                                                   status_key=self._status_key)
                                      for g in groups))
        self._seq += 1
        for g, row in zip(groups, rows):
            _add_registration(row, g)
        snap = {"seq": self._seq, "at_ms": int(time.time() * 1000),
                "took_ms": int((time.monotonic() - started_s) * 1000),
                "interval_ms": int(self.interval_s * 1000), "groups": list(rows),
                "consumer_groups": sorted({c for row in rows for n in row["nodes"]
                                           for c in n.get("consumer_groups", ())})}
        self.latest = snap
        return snap

    async def _run(self) -> None:
        """Poll and publish until no one is subscribed (or close()); rounds never overlap."""
        while self._subscribers and not self._closed:
            started_s = time.monotonic()
            try:
                payload = _encode(await self.snapshot())
            except Exception as err:  # a bug, not a node (those are rows): said, the loop goes on
                log.exception("console: cluster poll failed")
                payload = _encode({"error": f"poll failed: {err}", "at_ms": int(time.time() * 1000)})
            for sub in list(self._subscribers):
                sub.offer(payload)
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started_s)))

    async def close(self) -> None:
        """Stop the loop, end every subscription, close the session; safe to call twice."""
        self._closed = True
        for sub in list(self._subscribers):
            sub.close()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task], timeout=2 * self.node_timeout_s)
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def _add_registration(row: dict[str, Any], g: dict[str, Any]) -> None:
    """What the NameServer itself knows of each node: addresses, registered role, lease age."""
    registered = {n["node_id"]: n for n in g["nodes"]}
    row["registered_leader"] = g.get("leader")
    for n in row["nodes"]:
        reg = registered.get(n["node"])
        if reg is not None:
            n["registration"] = {"client_address": reg["client_address"],
                                 "admin_address": reg["admin_address"],
                                 "role": reg["role"], "term": reg["term"],
                                 "last_seen_s_ago": reg["last_seen_s_ago"]}
        n.pop("membership", None)  # the group's voters and learners say it once


def _encode(snap: dict[str, Any]) -> bytes:
    return json.dumps(snap, separators=(",", ":")).encode()
