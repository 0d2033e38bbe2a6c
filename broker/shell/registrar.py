"""Registers a broker node with every NameServer: once it has caught up with its group, at once on
every role or term change and whenever its topics change, and periodically (30 s by default),
carrying group, node id, client and admin addresses, role, term, the topic configuration and an
instance token drawn at start (only an unregister naming it, with the registered term, removes
the node), and who it knows as its term's leader (the NameServer routes a new leader once
another member confirms it); unregisters on stop. Each request is signed with the cluster credential when the
node has one (``protocol.cluster_key``; the NameServer refuses unsigned ones unless insecure).

A NameServer that restarts has forgotten every route, so waiting for the next periodic
registration would leave new clients without routes for up to an interval. Each NameServer is
therefore probed cheaply (``GET /livez``, every ``probe_s``): when one answers after it had
failed, or answers with another boot id (``X-NameServer-Boot-Id``: it restarted between two
probes), the node registers with it at once. Never blocks the node: every request has a
deadline, and a NameServer that does not answer is retried at the next probe or round.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any, Protocol

from broker.config import BrokerConfig
from broker.machine.state import BrokerState
from broker.shell.http_client import HttpClient, HttpClientError, HttpResponse
from dledger.node.config import Address
from dledger.node.runtime import Node
from protocol.cluster_key import sign_headers

log = logging.getLogger("broker.shell.registrar")

BOOT_ID_HEADER = "X-NameServer-Boot-Id"  # namesrv.server's; the broker does not import namesrv
PROBE_S_DEFAULT = 1.0


class RegistrarHost(Protocol):
    """What registration uses of a broker node (``broker.server.BrokerServer``)."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def node(self) -> Node: ...

    @property
    def state(self) -> BrokerState: ...

    @property
    def client_address(self) -> Address | None: ...

    @property
    def admin_address(self) -> Address | None: ...

    @property
    def grpc_address(self) -> Address | None: ...

    @property
    def remoting_address(self) -> Address | None: ...

    def caught_up(self) -> bool: ...


class Registrar:
    def __init__(self, server: RegistrarHost, namesrv: list[str], interval_s: float = 30.0,
                 check_s: float = 0.1, request_timeout_s: float = 2.0,
                 probe_s: float = PROBE_S_DEFAULT) -> None:
        self.server = server
        # A broker with TLS (--tls-*) registers over https, the NameServers' certificates
        # checked against its --tls-ca (docs/tls.md: a cluster is all-TLS or all-plain).
        tls = server.config.node.tls
        self.ssl_context = tls.dial_context() if tls is not None else None
        self.urls = [f"{'https' if tls else 'http'}://{a}" for a in namesrv]
        self.interval_s = interval_s
        self.check_s = check_s
        self.probe_s = probe_s
        self.request_timeout_s = request_timeout_s
        self.probe_timeout_s = min(request_timeout_s, probe_s)
        self.instance = uuid.uuid4().hex
        self._tasks: list[asyncio.Task[None]] = []
        self._http: HttpClient | None = None
        self._boot_ids: dict[str, str] = {}  # url -> the boot id it last answered with
        self._unsure: set[str] = set(self.urls)  # urls that may not hold our registration
        self._term: int | None = None  # the term of the last registration sent
        self.registrations = 0
        self.failures = 0
        self.reregistrations = 0  # registrations made because a probe found a NameServer back

    def start(self) -> None:
        self._http = HttpClient(self.ssl_context)
        self._tasks = [asyncio.create_task(self._run(), name="broker-registrar")]
        self._tasks += [asyncio.create_task(self._probe(u), name=f"broker-registrar-probe-{u}")
                        for u in self.urls]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._http is not None:
            if self._term is not None:
                node = self.server.config.node
                body = {"group": node.group, "node_id": node.node_id, "term": self._term,
                        "instance": self.instance}
                await asyncio.gather(*(self._post(u, "/v1/brokers/unregister", body)
                                       for u in self.urls))
            await self._http.close()

    async def _run(self) -> None:
        last: tuple[str, int, str | None, int] | None = None
        next_at = 0.0
        while True:
            raft = self.server.node.status().raft
            now = time.monotonic()
            seen = (raft.role.value, raft.term, raft.leader_id,  # (a follower's word confirms
                    hash(frozenset(self.server.state.topics.items())))  # its leader's claim)
            if not self.server.caught_up():
                pass  # a restarted node or a new leader would report stale topics: wait
            elif seen != last or now >= next_at:
                last, next_at = seen, now + self.interval_s
                await self._register(self.urls)
            await asyncio.sleep(self.check_s)  # a polling period, not a wait for an event

    async def _probe(self, url: str) -> None:
        """Re-register with ``url`` at once when it comes back or restarted."""
        assert self._http is not None
        while True:
            await asyncio.sleep(self.probe_s)  # the probe period
            try:
                resp = await self._http.request("GET", url + "/livez",
                                                timeout_s=self.probe_timeout_s)
            except HttpClientError:
                self._unsure.add(url)  # down or cut off: register again once it answers
                continue
            self._saw_boot_id(url, resp)
            if resp.status != 200:
                self._unsure.add(url)
            if url in self._unsure and self._term is not None and self.server.caught_up():
                self.reregistrations += 1
                await self._register([url])

    def _saw_boot_id(self, url: str, resp: HttpResponse) -> None:
        boot_id = resp.headers.get(BOOT_ID_HEADER)
        if boot_id is not None and self._boot_ids.setdefault(url, boot_id) != boot_id:
            self._boot_ids[url] = boot_id
            self._unsure.add(url)  # a new NameServer process: it holds nothing of ours

    async def _register(self, urls: list[str]) -> None:
        body = self.registration()
        self._term = body["term"]
        await asyncio.gather(*(self._post(u, "/v1/brokers/register", body) for u in urls))

    def registration(self) -> dict[str, Any]:
        s, node = self.server, self.server.config.node
        raft = s.node.status().raft
        role = {"pre_candidate": "candidate"}.get(raft.role.value, raft.role.value)
        return {"group": node.group, "node_id": node.node_id,
                "client_address": _fmt(s.config.registered("client", s.client_address)
                                       if s.client_address else None),
                "admin_address": _fmt(s.config.registered("admin", s.admin_address)
                                      if s.admin_address else None),
                "role": role, "term": raft.term, "instance": self.instance,
                "leader": raft.leader_id or "",
                "members": sorted(raft.voters + raft.learners),
                **({"grpc_address": _fmt(s.grpc_address)} if s.grpc_address else {}),
                **({"remoting_address": _fmt(s.remoting_address)} if s.remoting_address else {}),
                "auto_create_queues": (s.config.default_queues if s.config.auto_create_topics
                                       else 0),
                "topics": {t.name: {"read_queues": t.read_queues, "write_queues": t.write_queues,
                                    "perm": t.perm} for t in s.state.topics.values()}}

    def _signed(self, path: str, raw: bytes) -> dict[str, str]:
        """The request's headers: JSON, and the cluster credential's signature if it has one
        (``protocol.cluster_key``; a fresh nonce and time on every request, retries too)."""
        headers = {"Content-Type": "application/json"}
        key = self.server.config.cluster_key
        if key is not None:
            node = self.server.config.node
            headers.update(sign_headers(key, "POST", path, f"{node.group}/{node.node_id}", raw,
                                        int(time.time() * 1000)))
        return headers

    async def _post(self, url: str, path: str, body: dict[str, Any]) -> None:
        assert self._http is not None
        raw = json.dumps(body, separators=(",", ":")).encode()
        try:
            resp = await self._http.request("POST", url + path, body=raw,
                                            headers=self._signed(path, raw),
                                            timeout_s=self.request_timeout_s)
        except HttpClientError as err:
            self.failures += 1
            self._unsure.add(url)
            log.warning("cannot reach NameServer %s: %s", url, err)
            return
        self._saw_boot_id(url, resp)
        if resp.status != 200:
            self.failures += 1
            if resp.status >= 500:  # (a refusal, 4xx, waits for the next round)
                self._unsure.add(url)
            log.warning("%s%s answered %d: %s", url, path, resp.status, resp.text())
            return
        self.registrations += 1
        self._unsure.discard(url)


def _fmt(addr: tuple[str, int] | None) -> str:
    return f"{addr[0]}:{addr[1]}" if addr else "0.0.0.0:0"
