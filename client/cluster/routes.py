"""Routes from the NameServers: which groups serve a topic, their nodes and leader, their queue
counts; and one connection pool (a ``GroupClient``) per group that follows leader redirects.

Owns caching (a route is refreshed every 30 s, that of a topic no group serves yet every 1 s, and
at once after an error; with no NameServer answering, the last known route is used) and the
mapping of server error codes to the client's exceptions. A topic no group serves yet routes to
every group of the cluster, where the first send auto-creates it. What a route says of a group's
leader is a suggestion its connection pool weighs against what the nodes answered.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

from client import errors
from protocol.auth import Credentials
from protocol.envelope import BadRequestError, RemoteError
from protocol.errors import DiskFullError, DLedgerError, NodeStoppedError, NotLeaderError, OutcomeUnknownError
from protocol.errors import OverloadedError as LogOverloadedError
from protocol.errors import TlsError as LogTlsError
from protocol.group_client import GroupClient, UnknownLeaderError
from protocol.group_client import UnavailableError as LogUnavailableError
from protocol.namesrv_addrs import parse_namesrv_list
from protocol.tls import dial_context, split_https, tls_failure

if TYPE_CHECKING:
    import ssl

ROUTE_REFRESH_S = 30.0
ROUTE_RETRY_S = 0.2  # before a group's route is read again for a leader it did not name
NOT_FOUND_REFRESH_S = 1.0  # a topic no group serves yet may be auto-created any moment
DEFAULT_QUEUES = 4
# Seeded bugs for the chaos suite (tests only, never in production): "stale_leader" brings back
# the leader tracking that kept dialling a silent old leader (issue 16 item 1), see GroupClient.
CANARIES = ("stale_leader",)


def _random_namesrv(count: int) -> int:
    return random.randrange(count)


first_namesrv = _random_namesrv  # which of ``count`` NameServers a client asks first


@dataclass(frozen=True)
class GroupRoute:
    group: str
    leader: str | None
    nodes: dict[str, tuple[str, int]]  # node id -> client address
    read_queues: int
    write_queues: int
    perm: int
    term: int = 0  # the term at which the NameServer saw ``leader`` lead (0: not known)
    grpc: dict[str, tuple[str, int]] = field(default_factory=dict)  # node id -> gRPC address


@dataclass(frozen=True)
class TopicRoute:
    topic: str
    groups: tuple[GroupRoute, ...]
    fetched_at: float
    exists: bool  # False: routed to every group for auto-create


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


PLAIN_HINT = ("; a NameServer that speaks TLS closes plain connections: give the cluster's CA "
              "(tls_ca=, --tls-ca or DLEDGER_TLS_CA)")


class Routes:
    """``tls_ca``: the CA file of a cluster that speaks TLS (else ``DLEDGER_TLS_CA``); with it,
    or with NameServer addresses written ``https://host:port``, every connection (NameServers
    and brokers) is TLS, certificates and host names verified (``protocol.tls.dial_context``).
    ``ssl_context`` (instead of ``tls_ca``): a context made by the caller. ``from_env=False``: the
    environment is not read (a server's own client: its options alone say whether it speaks TLS
    and as whom it signs). ``new_topic_queues``: the write queues a route gives a topic no group
    serves yet (what its first send asks the broker to create; the broker may create fewer)."""

    def __init__(self, namesrv: str | Sequence[str], request_timeout_s: float = 3.0, *,
                 canaries: Sequence[str] = (), credentials: Credentials | None = None,
                 tls_ca: str | None = None, ssl_context: ssl.SSLContext | None = None,
                 from_env: bool = True, new_topic_queues: int = DEFAULT_QUEUES) -> None:
        unknown = set(canaries) - set(CANARIES)
        if unknown:
            raise ValueError(f"unknown client canaries {sorted(unknown)} (known: {list(CANARIES)})")
        self._stale_leader_canary = "stale_leader" in canaries
        # Every broker request is signed with these (a cluster with access control): given, or
        # from DLEDGER_ACCESS_KEY and DLEDGER_SECRET_KEY (a ValueError if only one is set)
        self.credentials = credentials if credentials is not None or not from_env \
            else Credentials.from_env()
        # "a:9876;b" or ["a:9876", "b"]: the broker's and the command line's parser (a
        # NameSrvAddressError, a ValueError, names a bad entry)
        addresses, https = split_https([namesrv] if isinstance(namesrv, str) else list(namesrv))
        self.ssl_context = ssl_context or dial_context(tls_ca, https, from_env)
        scheme = "https" if self.ssl_context is not None else "http"
        self.urls = [f"{scheme}://{a}" for a in parse_namesrv_list(addresses)]
        # RocketMQ's choice: a random NameServer first, kept while it answers; when it does
        # not, the next in the list (round robin), so clients spread over the NameServers
        self._namesrv_at = first_namesrv(len(self.urls))
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._routes: dict[str, TopicRoute] = {}
        self.new_topic_queues = new_topic_queues
        self._groups: dict[str, GroupClient] = {}
        self._stale: set[str] = set()

    async def start(self) -> None:
        """Fail fast when no NameServer answers."""
        self._session = aiohttp.ClientSession(
            timeout=self.timeout, connector=aiohttp.TCPConnector(ssl=self.ssl_context or True))
        try:
            await self._get("/v1/cluster")
        except BaseException:
            await self.close()  # no caller will: the failed start() returned no client to close
            raise

    async def close(self) -> None:
        for c in self._groups.values():
            await c.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def route(self, topic: str, refresh: bool = False) -> TopicRoute:
        """The topic's route, from the cache while it is fresh. When no NameServer answers, the
        last route known is still used (the groups' own redirects keep it useful)."""
        cached = self._routes.get(topic)
        if (cached and not refresh and topic not in self._stale
                and time.monotonic() - cached.fetched_at < (
                    ROUTE_REFRESH_S if cached.exists else NOT_FOUND_REFRESH_S)):
            return cached
        try:
            return await self._fetch(topic)
        except errors.UnavailableError:
            if cached is None or not cached.groups:
                raise
            return cached

    async def _fetch(self, topic: str) -> TopicRoute:
        status, body = await self._get(f"/v1/topics/{topic}/route")
        if status == 200:
            groups = tuple(_group(g) for g in body["groups"])
            route = TopicRoute(topic, groups, time.monotonic(), True)
        else:  # not served yet: any group can auto-create it on the first send
            n = self.new_topic_queues
            groups = tuple(GroupRoute(g.group, g.leader, g.nodes, n, n, 6, g.term, g.grpc)
                           for g in await self.cluster_groups())
            route = TopicRoute(topic, groups, time.monotonic(), False)
        if not route.groups:  # nothing registered yet (a cluster starting up): try again soon
            raise errors.UnavailableError(f"no broker group is registered to serve {topic!r}")
        self._routes[topic] = route
        self._stale.discard(topic)
        return route

    async def cluster_groups(self) -> list[GroupRoute]:
        """Every registered broker group (queue counts unknown: 0)."""
        _, cluster = await self._get("/v1/cluster")
        return [GroupRoute(g["group"], g.get("leader"),
                           {n["node_id"]: _addr(n["client_address"]) for n in g["nodes"]}, 0, 0, 6,
                           int(g.get("term") or 0), _grpc(g))
                for g in cluster["groups"] if g["nodes"]]

    def invalidate(self, topic: str) -> None:
        """Refresh the route on its next use (kept meanwhile, for when no NameServer answers)."""
        self._stale.add(topic)

    def group_client(self, g: GroupRoute) -> GroupClient:
        """The group's connection pool. The route's leader is only a suggestion: what the
        group's own answers taught the pool wins over an older route (GroupClient.suggest)."""
        client = self._groups.get(g.group)
        if client is None or client.nodes != g.nodes:
            client = GroupClient(g.nodes, timeout_s=3.0, stale_leader_canary=self._stale_leader_canary,
                               credentials=self.credentials, ssl_context=self.ssl_context,
                               group=g.group)
            self._groups[g.group] = client
        client.suggest(g.leader, g.term)
        return client

    async def call_group_leader(self, g: GroupRoute, kind: int, *args: Any,
                                timeout_s: float | None = None) -> tuple[str, Any]:
        """One request to a group's leader (``GroupClient.call_leader``), within ``timeout_s``
        (the pool's own by default). A leader the route does not name (a node added since the
        route was read, to which leadership moved) is looked up again at the NameServer until
        the deadline: a NOT_LEADER answer means the request was not acted on, so it goes again."""
        deadline = time.monotonic() + (timeout_s or self.group_client(g).timeout_s)
        while True:
            try:
                return await self.group_client(g).call_leader(
                    kind, *args, timeout_s=max(0.1, deadline - time.monotonic()))
            except UnknownLeaderError:
                if time.monotonic() + ROUTE_RETRY_S >= deadline:
                    raise
            await asyncio.sleep(ROUTE_RETRY_S)  # (the new leader registers at once: a moment)
            g = next((x for x in await self.cluster_groups() if x.group == g.group), g)

    async def _get(self, path: str) -> tuple[int, Any]:
        assert self._session is not None, "call start() first"
        last: Exception | None = None
        for k in range(len(self.urls)):  # any NameServer will do: the one chosen, then the next
            at = (self._namesrv_at + k) % len(self.urls)
            url = self.urls[at]
            try:
                async with self._session.get(url + path) as resp:
                    got = resp.status, await resp.json()
            except (aiohttp.ClientError, TimeoutError, ValueError) as err:
                why = tls_failure(err)
                if why is not None:  # no other NameServer's certificate would be trusted more
                    raise errors.TlsError(f"NameServer {url}: {why}") from err
                last = err
                continue
            self._namesrv_at = at
            return got
        hint = PLAIN_HINT if self.ssl_context is None and isinstance(
            last, aiohttp.ServerDisconnectedError) else ""
        raise errors.UnavailableError(f"no NameServer answered ({', '.join(self.urls)}): "
                                      f"{last}{hint}")


def _group(g: dict[str, Any]) -> GroupRoute:
    return GroupRoute(g["group"], g.get("leader"),
                      {n["node_id"]: _addr(n["client_address"]) for n in g["nodes"]},
                      int(g["read_queues"]), int(g["write_queues"]), int(g["perm"]),
                      int(g.get("term") or 0), _grpc(g))


def _grpc(g: dict[str, Any]) -> dict[str, tuple[str, int]]:
    return {n["node_id"]: _addr(n["grpc_address"]) for n in g["nodes"] if n.get("grpc_address")}


_CODES: dict[str, type[errors.ClientError]] = {
    "TOPIC_NOT_FOUND": errors.TopicNotFoundError,
    "NO_PERMISSION": errors.NoPermissionError,
    "MESSAGE_TOO_LARGE": errors.MessageTooLargeError,
    "INVALID_TOPIC": errors.InvalidTopicError,
    "QUEUE_NOT_FOUND": errors.UnavailableError,  # a stale route (queues shrank): refresh, retry
    "BAD_REQUEST": errors.NonRetriableError,
    "BAD_DELAY": errors.BadDelayError,
    "BAD_TRANSACTION": errors.BadTransactionError,
    "GROUP_ACTIVE": errors.ConsumerGroupActiveError,
    "MESSAGE_NOT_FOUND": errors.MessageNotFoundError,
    "CLIENT_NOT_CONNECTED": errors.ClientNotConnectedError,
    "CLIENT_NO_ANSWER": errors.ClientNoAnswerError,
    "ACCESS_DENIED": errors.AccessDeniedError,
    "SIGNATURE_REFUSED": errors.SignatureError,
}
TRANSACTION_STATUSES = ("TXN_NOT_FOUND", "TXN_ALREADY_DECIDED", "OFFSET_CONFLICT", "TXN_CHANGED",
                        "TXN_TOO_LARGE", "TXN_UNREADABLE")


def client_error(err: DLedgerError) -> errors.ClientError:
    """The client library's exception for an error of the transport layer or of a broker."""
    if isinstance(err, RemoteError):
        if err.code in TRANSACTION_STATUSES:
            return errors.TransactionError(str(err), err.code)
        return _CODES.get(err.code, errors.NonRetriableError)(str(err))
    if isinstance(err, BadRequestError):
        return errors.NonRetriableError(str(err))
    if isinstance(err, LogTlsError):
        return errors.TlsError(str(err))
    if isinstance(err, OutcomeUnknownError):
        return errors.SendTimeoutError(str(err))
    if isinstance(err, LogOverloadedError):
        return errors.OverloadedError(str(err))
    if isinstance(err, UnknownLeaderError):
        return errors.StaleRouteError(str(err))
    if isinstance(err, NotLeaderError):
        return errors.NoLeaderYetError(str(err))
    if isinstance(err, (LogUnavailableError, NodeStoppedError, DiskFullError)):
        return errors.UnavailableError(str(err))
    return errors.ClientError(str(err))
