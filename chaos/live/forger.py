"""An attacker beside every live chaos run: it sends the NameServer forged registrations and
unregistrations while the scenario's faults run, reads the routes after each, and records what
it got, for ``chaos.live.checkers.registrations`` to judge.

Each turn (every ``TURN_S``, jittered by the run's RNG) it reads the group's routed leader and
term, then sends one of:
- a leader claim for a node ``forged-<n>`` at the routed term + 1, unsigned; or signed with a
  credential of its own (a wrong one); or unsigned at term 2^62;
- an unregister of the routed leader at its term, unsigned;
- a negative control: a follower registration of a probe node at term 0, signed with the
  cluster's credential (it must pass), the very same request sent again at once (a replay: it
  must be refused; judged only when both answers name the same NameServer boot), then the
  probe's signed unregister (it must pass), so the probe is routed nowhere for long.
The forger never holds the real credential for its forgeries: they model someone who reaches the
NameServer's port. A request that gets no answer (the NameServer killed or cut off) is recorded
unanswered.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import ssl
import time
from typing import Any

import aiohttp

from chaos.live.checkers.registrations import FORGED_PREFIX, Attempt
from protocol.cluster_key import sign_headers

__all__ = ["Forger"]

TURN_S = 0.5
REQUEST_TIMEOUT_S = 2.0
REGISTER, UNREGISTER = "/v1/brokers/register", "/v1/brokers/unregister"
BOOT_ID = "X-NameServer-Boot-Id"


class Forger:
    """Runs until ``stop``; ``attempts`` and ``routed`` are its record."""

    def __init__(self, namesrv: str, group: str, key: bytes, rng: random.Random,
                 stop: asyncio.Event, ssl_context: ssl.SSLContext | None = None) -> None:
        self.base = f"{'https' if ssl_context else 'http'}://{namesrv}"
        self.group, self.key, self.rng, self.stop = group, key, rng, stop
        self.ssl = ssl_context
        self.wrong_key = secrets.token_hex(32).encode()
        self.attempts: list[Attempt] = []
        self.routed: list[str | None] = []
        self._n = 0

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(
                timeout=timeout, connector=aiohttp.TCPConnector(ssl=self.ssl or True)) as http:
            while not self.stop.is_set():
                await self._turn(http)
                try:  # the attacker's pace: the schedule, not a wait for a condition
                    await asyncio.wait_for(self.stop.wait(), TURN_S * (0.5 + self.rng.random()))
                except TimeoutError:
                    pass
            await self._read_route(http)  # one last read after the faults

    async def _turn(self, http: aiohttp.ClientSession) -> None:
        leader, term = await self._read_route(http)
        self._n += 1
        kind = self.rng.choice(("unsigned_claim", "wrong_key_claim", "far_claim",
                                "spoofed_unregister", "control"))
        forged = f"{FORGED_PREFIX}{self._n}"
        if kind == "spoofed_unregister":
            if leader is None:
                return
            body: dict[str, Any] = {"group": self.group, "node_id": leader, "term": term}
            await self._send(http, kind, UNREGISTER, body)
        elif kind == "control":
            await self._control(http)
        else:
            claim_term = 2**62 if kind == "far_claim" else term + 1
            body = {"group": self.group, "node_id": forged, "client_address": "127.0.0.1:9",
                    "admin_address": "127.0.0.1:9", "role": "leader", "term": claim_term,
                    "members": [forged], "leader": forged, "topics": {}}
            await self._send(http, kind, REGISTER, body,
                             self.wrong_key if kind == "wrong_key_claim" else None)
        await self._read_route(http)

    async def _control(self, http: aiohttp.ClientSession) -> None:
        probe = f"probe-{self._n}"
        body = {"group": self.group, "node_id": probe, "client_address": "127.0.0.1:9",
                "admin_address": "127.0.0.1:9", "role": "follower", "term": 0,
                "instance": probe, "topics": {}}
        raw = json.dumps(body).encode()
        headers = sign_headers(self.key, "POST", REGISTER, f"{self.group}/{probe}", raw,
                               int(time.time() * 1000))
        status, boot = await self._post(http, REGISTER, raw, headers)
        self.attempts.append(Attempt("control", status))
        if status == 200:
            again, boot_again = await self._post(http, REGISTER, raw, headers)
            same_boot = boot is not None and boot == boot_again
            self.attempts.append(Attempt("replay", again if same_boot else None))
        leave = {"group": self.group, "node_id": probe, "term": 0, "instance": probe}
        raw = json.dumps(leave).encode()
        status, _ = await self._post(http, UNREGISTER, raw, sign_headers(
            self.key, "POST", UNREGISTER, f"{self.group}/{probe}", raw, int(time.time() * 1000)))
        self.attempts.append(Attempt("control", status))

    async def _send(self, http: aiohttp.ClientSession, kind: str, path: str,
                    body: dict[str, Any], key: bytes | None = None) -> None:
        raw = json.dumps(body).encode()
        headers = {} if key is None else sign_headers(
            key, "POST", path, f"{body['group']}/{body['node_id']}", raw, int(time.time() * 1000))
        status, _ = await self._post(http, path, raw, headers)
        self.attempts.append(Attempt(kind, status))

    async def _post(self, http: aiohttp.ClientSession, path: str, raw: bytes,
                    headers: dict[str, str]) -> tuple[int | None, str | None]:
        try:
            async with http.post(self.base + path, data=raw, headers={
                    **headers, "Content-Type": "application/json"}) as resp:
                await resp.read()
                return resp.status, resp.headers.get(BOOT_ID)
        except (TimeoutError, aiohttp.ClientError):
            return None, None

    async def _read_route(self, http: aiohttp.ClientSession) -> tuple[str | None, int]:
        try:
            async with http.get(self.base + "/v1/cluster") as resp:
                groups = (await resp.json())["groups"] if resp.status == 200 else []
        except (TimeoutError, aiohttp.ClientError, ValueError, KeyError):
            return None, 0
        for g in groups:
            if g.get("group") == self.group:
                self.routed.append(g.get("leader"))
                return g.get("leader"), int(g.get("term", 0))
        return None, 0
