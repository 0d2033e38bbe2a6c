"""A front end's forward to its group's leader (``LeaderForward``), for clients that do not
follow redirects (RocketMQ's, over gRPC or the remoting protocol): the broker API
(``broker.api.api.BrokerApi``) calls it with a request this node must not serve, and it sends
the request once to the leader through the group's connection pool from the front end's
``Routes`` (``GroupClient.call_leader``, which follows NOT_LEADER hints), with the group's nodes
as the NameServers list them (cached; looked up again, until the request's deadline, while the
pool does not know the leader it is pointed to: a node that registered since). With access
control on, a forward is signed as the account the front end authenticated (its credentials
given by the broker API): a pool of its own per account, at most ``SIGNED_POOLS_MAX`` kept.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from client import errors
from client.cluster.routes import GroupRoute, Routes
from protocol.auth import Credentials
from protocol.group_client import GroupClient, UnknownLeaderError

__all__ = ["NODES_POLL_S", "ROUTE_REFRESH_S", "SIGNED_POOLS_MAX", "LeaderForward", "RoutesOnce"]

SIGNED_POOLS_MAX = 64  # accounts' connection pools to the leader kept (the oldest closed)

ROUTE_REFRESH_S = 30.0  # the group's nodes as the NameServers list them, looked up this often
NODES_POLL_S = 0.1  # looked up again this soon while they do not list the leader


class RoutesOnce:
    """A front end's ``Routes`` started on first use (``ensure``; concurrent first calls start
    it once; fails fast, UnavailableError, while no NameServer answers) and closed with it."""

    def __init__(self, routes: Routes) -> None:
        self.routes = routes
        self.started = False
        self._lock = asyncio.Lock()

    async def ensure(self) -> None:
        if self.started:
            return
        async with self._lock:
            if not self.started:
                await self.routes.start()
                self.started = True

    async def close(self) -> None:
        if self.started:
            await self.routes.close()


class LeaderForward:
    """``await forward(kind, args, timeout_s)``: the leader's answer, or its named refusal
    (``RemoteError``) or the log's error."""

    def __init__(self, group: str, routes: Routes,
                 ensure_routes: Callable[[], Awaitable[None]]) -> None:
        self.group = group
        self.routes = routes
        self.ensure_routes = ensure_routes
        self._route: GroupRoute | None = None
        self._route_s = 0.0
        self._signed: dict[Credentials, GroupClient] = {}  # by account, oldest first

    async def __call__(self, kind: int, args: list[Any], timeout_s: float,
                       credentials: Credentials | None = None) -> Any:
        deadline = time.monotonic() + timeout_s
        refresh = False
        while True:
            client = await self._client(refresh, credentials)
            try:
                _, result = await client.call_leader(
                    kind, *args, timeout_s=max(0.001, deadline - time.monotonic()))
                return result
            except UnknownLeaderError:  # a node the NameServers did not list when last asked
                if time.monotonic() + NODES_POLL_S >= deadline:
                    raise
            refresh = True  # (certainly not acted on: the leader was never asked)
            await asyncio.sleep(NODES_POLL_S)  # polling the NameServers until they list it

    async def close(self) -> None:
        pools, self._signed = list(self._signed.values()), {}
        for pool in pools:
            await pool.close()

    async def _client(self, refresh: bool, credentials: Credentials | None) -> GroupClient:
        if refresh or self._route is None \
                or time.monotonic() - self._route_s > ROUTE_REFRESH_S:
            await self.ensure_routes()
            found = next((g for g in await self.routes.cluster_groups()
                          if g.group == self.group), None)
            if found is None:
                raise errors.UnavailableError(
                    f"the NameServers do not list this node's group {self.group!r} yet")
            self._route, self._route_s = found, time.monotonic()
        # (the pool weighs the leader the route names against what the nodes answered)
        if credentials is None:
            return self.routes.group_client(self._route)
        route = self._route
        pool = self._signed.get(credentials)
        if pool is None or pool.nodes != route.nodes:
            if pool is not None:
                await self._signed.pop(credentials).close()
            while len(self._signed) >= SIGNED_POOLS_MAX:
                await self._signed.pop(next(iter(self._signed))).close()
            pool = self._signed[credentials] = GroupClient(
                route.nodes, timeout_s=3.0, credentials=credentials,
                ssl_context=self.routes.ssl_context, group=route.group)
        pool.suggest(route.leader, route.term)
        return pool
