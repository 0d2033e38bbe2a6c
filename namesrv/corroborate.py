"""Asking a broker group about a term: the NameServer's check of a registration whose term jumps
past every term the group's live nodes have reported (``Registry.term_to_verify``).

The nodes' admin endpoints answer ``GET /status`` with their Raft view (``{"group", "raft":
{"node_id", "term", ...}}``). A term is corroborated when the registering node itself, or any live
node of its group, answers as itself, of that group, at that term or a higher one. Every
request has a short deadline and a bounded body; only a few checks run at once, so a flood of
bad registrations costs bounded work and never delays the registry (which stays pure: all the
I/O is here, in the server shell).

Why ask rather than bound the jump: a NameServer that was away (restarted, cut off) while a group
went through many elections must still accept the group's real term, and only the group knows
it. A single bad request (an absurd term, someone else's address) is refused, because no node
of the group reports that term.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any

import aiohttp

from namesrv.errors import TermNotCorroboratedError
from namesrv.model import Registration
from protocol.cluster_key import status_headers

if TYPE_CHECKING:
    import ssl

__all__ = ["Corroborator"]

log = logging.getLogger(__name__)

STATUS_TIMEOUT_S = 1.0
STATUS_BYTES_MAX = 256 * 1024
CHECKS_AT_ONCE = 8


class Corroborator:
    """Checks terms against the group's admin endpoints; owns one HTTP client session."""

    def __init__(self, timeout_s: float = STATUS_TIMEOUT_S,
                 ssl_context: ssl.SSLContext | None = None,
                 status_key: bytes | None = None) -> None:
        self._status_key = status_key  # signs each /status read (brokers' --protect-status)
        # ssl_context: the brokers' admin endpoints speak TLS (the NameServer's --tls-ca)
        self._ssl = ssl_context
        self._scheme = "https" if ssl_context is not None else "http"
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._slots = asyncio.Semaphore(CHECKS_AT_ONCE)
        self.checks = 0
        self.refused = 0

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def check(self, reg: Registration, known_term: int, peers: dict[str, str]) -> None:
        """Return if ``reg.term`` is reported by ``reg``'s node or one of ``peers`` (node id ->
        admin address); else raise ``TermNotCorroboratedError``."""
        asked = {**peers, reg.node_id: reg.admin_address}  # the node's own, latest address
        async with self._slots:
            self.checks += 1
            answers = await asyncio.gather(*(self._term_of(reg.group, node_id, address)
                                             for node_id, address in asked.items()))
        best = max((t for t in answers if t is not None), default=None)
        if best is not None and best >= reg.term:
            return
        self.refused += 1
        log.warning("registration of %s/%s at term %d refused: the group reports term %s "
                    "(asked %d nodes)", reg.group, reg.node_id, reg.term,
                    best if best is not None else known_term, len(asked))
        raise TermNotCorroboratedError(
            f"term {reg.term} of {reg.group}/{reg.node_id} is beyond what the group reports "
            f"(term {best if best is not None else known_term}, {len(asked)} nodes asked): "
            "not registered")

    async def _term_of(self, group: str, node_id: str, address: str) -> int | None:
        """The term ``node_id`` reports at ``address``, if it answers as that node of ``group``."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, connector=aiohttp.TCPConnector(ssl=self._ssl or True))
        try:
            async with self._session.get(
                    f"{self._scheme}://{address}/status", allow_redirects=False,
                    headers=status_headers(self._status_key, int(time.time() * 1000))) as resp:
                raw = await resp.content.read(STATUS_BYTES_MAX + 1)
                if resp.status != 200 or len(raw) > STATUS_BYTES_MAX:
                    return None
        except (TimeoutError, aiohttp.ClientError, ValueError) as err:
            log.info("cannot ask %s/%s at %s about its term: %r", group, node_id, address, err)
            return None
        return _reported_term(raw, group, node_id)


def _reported_term(raw: bytes, group: str, node_id: str) -> int | None:
    try:
        status: Any = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    raft = status.get("raft") if isinstance(status, dict) else None
    if not isinstance(raft, dict) or status.get("group") != group \
            or raft.get("node_id") != node_id:
        return None
    term = raft.get("term")
    return term if isinstance(term, int) and not isinstance(term, bool) else None
