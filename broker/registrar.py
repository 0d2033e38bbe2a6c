"""Registers a broker node with every NameServer: once it has caught up with its group, at once on
every role or term change and whenever its topics change, and periodically (30 s by default), carrying group, node id, client and admin addresses, role,
term and the topic configuration; unregisters on stop. NameServers that do not answer are
retried on the next round (never blocking the node: every request has a deadline)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import aiohttp

if TYPE_CHECKING:
    from broker.server import BrokerServer

log = logging.getLogger("broker.registrar")


class Registrar:
    def __init__(self, server: BrokerServer, namesrv: list[str], interval_s: float = 30.0,
                 check_s: float = 0.1, request_timeout_s: float = 2.0) -> None:
        self.server = server
        self.urls = [f"http://{a}" for a in namesrv]
        self.interval_s = interval_s
        self.check_s = check_s
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self.registrations = 0
        self.failures = 0

    def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=self.timeout)
        self._task = asyncio.create_task(self._run(), name="broker-registrar")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._session is not None:
            node = self.server.config.node
            body = {"group": node.group, "node_id": node.node_id}
            await asyncio.gather(*(self._post(u, "/v1/brokers/unregister", body) for u in self.urls))
            await self._session.close()

    async def _run(self) -> None:
        last: tuple[str, int, int] | None = None
        next_at = 0.0
        while True:
            raft = self.server.node.status().raft
            now = time.monotonic()
            seen = (raft.role.value, raft.term, hash(frozenset(self.server.state.topics.items())))
            if not self.server.caught_up():
                pass  # a restarted node or a new leader would report stale topics: wait
            elif seen != last or now >= next_at:
                last, next_at = seen, now + self.interval_s
                body = self.registration()
                await asyncio.gather(*(self._post(u, "/v1/brokers/register", body) for u in self.urls))
            await asyncio.sleep(self.check_s)  # a polling period, not a wait for an event

    def registration(self) -> dict[str, Any]:
        s, node = self.server, self.server.config.node
        raft = s.node.status().raft
        role = {"pre_candidate": "candidate"}.get(raft.role.value, raft.role.value)
        return {"group": node.group, "node_id": node.node_id,
                "client_address": _fmt(s.config.advertise_client or s.client_address),
                "admin_address": _fmt(s.admin_address),
                "role": role, "term": raft.term,
                "topics": {t.name: {"read_queues": t.read_queues, "write_queues": t.write_queues,
                                    "perm": t.perm} for t in s.state.topics.values()}}

    async def _post(self, url: str, path: str, body: dict[str, Any]) -> None:
        assert self._session is not None
        try:
            async with self._session.post(url + path, json=body) as resp:
                if resp.status != 200:
                    self.failures += 1
                    log.warning("%s%s answered %d: %s", url, path, resp.status, await resp.text())
                    return
                self.registrations += 1
        except (aiohttp.ClientError, asyncio.TimeoutError) as err:
            self.failures += 1
            log.warning("cannot reach NameServer %s: %s", url, err)


def _fmt(addr: tuple[str, int] | None) -> str:
    return f"{addr[0]}:{addr[1]}" if addr else "0.0.0.0:0"
