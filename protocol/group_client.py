"""A client of one group's servers (a replicated-log group or a broker group): requests to one
node, and requests to the leader that follow redirects.

Owns connections (one per server, many requests in flight, matched by request id), deadlines
and the retry rule: a request to the leader is retried on another node only when it certainly
was not acted on (NOT_LEADER, or the connection could not be made); when the outcome is unknown
(timeout, leadership lost, connection lost after sending) the caller gets the named error; and
a node that keeps closing connections before it answers is dialled again only after a pause.
The log's client (``dledger.client.LogClient``) and the broker's client library (``client/``)
build on it; so does a broker node that forwards a request to its leader.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from protocol.auth import Credentials, Signer
from protocol.envelope import (
    Response,
    decode_response,
    encode_request,
    error_from,
)
from protocol.errors import (
    DiskFullError,
    DLedgerError,
    NodeStoppedError,
    NotLeaderError,
    OutcomeUnknownError,
    ProposalTimeoutError,
    TlsError,
    WireError,
)
from protocol.framed import FramedProtocol
from protocol.frames import decode_payload
from protocol.tls import SSLError

if TYPE_CHECKING:
    import ssl

# A silent node is dialled again (after the others) once it has been silent this long: the other
# nodes elect a new leader within an election timeout (1-2 s by default) of a real silence, so
# past that a node that only seemed silent (it was slow) is found again.
SILENT_GRACE_S = 3.0
# ... but a follower that names the silent node as leader, at the term it went silent in, this
# long after the request it left unanswered was sent, shows that it leads still: a follower
# stops naming its leader once it has not heard from it for an election timeout (at most 2 s by
# default; it then campaigns, with no leader), so the node spoke to its peers after it stopped
# answering this client. Its answers were lost or late (a cut in one direction, a slow client
# link): it is dialled again at once, and the send that timed out on it can still be answered
# within its deadline (the unique key makes the retry safe).
LEADS_PROOF_S = 2.5
CANARY_SUSPECT_S = 5.0  # the stale_leader canary only: a silent node is forgotten this soon
# A node that takes a request and closes the connection before answering (reset or EOF with the
# request in flight: a crashing node, a proxy or a broken listener) is dialled again at once twice;
# from the third such close in a row it is silent (the others are tried first) and dialled again
# only after a pause drawn from [half, all] of 0.1 s doubling per close up to 2 s, until it answers.
CLOSES_BEFORE_BACKOFF = 3
CLOSE_BACKOFF_MIN_S = 0.1
CLOSE_BACKOFF_MAX_S = 2.0

Address = tuple[str, int]  # (host, port)


class UnavailableError(DLedgerError):
    """No server could be reached (or none knew a leader) before the deadline."""


class UnknownLeaderError(UnavailableError):
    """A node named a leader this client has no address for: refresh the membership and retry."""

    def __init__(self, leader_hint: str) -> None:
        super().__init__(f"the leader is {leader_hint!r}, which this client does not know")
        self.leader_hint = leader_hint


class UnknownNodeError(DLedgerError):
    """The node id is not one of the client's nodes."""


class ConnectionLostError(OutcomeUnknownError):
    """The connection dropped after the request was sent: it may or may not have taken effect."""


# A server-initiated frame (e.g. a broker's transaction check-back): its kind and fields.
PushHandler = Callable[[int, list[Any]], None]
PUSH_KINDS = range(150, 160)  # the kinds a server may send unasked (protocol.broker_kinds's)


class Connection(FramedProtocol):
    """One server connection; many requests in flight, matched to responses by request id.
    Frames of a ``PUSH_KINDS`` kind go to ``push_handler`` (dropped when there is none)."""

    def __init__(self, push_handler: PushHandler | None = None, signer: Signer | None = None,
                 target: str = "") -> None:
        super().__init__()
        self.signer = signer  # signs each request for ``target`` (a cluster with access control)
        self.target = target  # "group/node"
        self.waiting: dict[int, asyncio.Future[Response]] = {}
        self.ids = itertools.count(1)
        self.refusal: DLedgerError | None = None  # the server refused the connection itself
        self.push_handler = push_handler
        self.close_counted = False  # its loss with requests in flight was counted (GroupClient)

    def payload_received(self, payload: bytes) -> None:
        try:
            resp = decode_response(payload)
        except WireError as err:
            if self._pushed(payload):
                return
            self.framing_failed(err)
            if self.transport is not None:
                self.transport.close()
            return
        if resp.request_id == -1 and resp.code == "OVERLOADED":  # the server refused this
            self.refusal = error_from(resp)  # connection (too many): none of its requests ran
            self._fail_all(self.refusal)
            return
        fut = self.waiting.pop(resp.request_id, None)
        if fut is not None and not fut.done():
            fut.set_result(resp)

    def _pushed(self, payload: bytes) -> bool:
        """Whether ``payload`` is a server-initiated frame (handed on): not a bad response."""
        try:
            kind, fields = decode_payload(payload)
        except WireError:
            return False
        if kind not in PUSH_KINDS:
            return False
        if self.push_handler is not None:
            self.push_handler(kind, fields)
        return True

    def framing_failed(self, err: WireError) -> None:
        self._fail_all(ConnectionLostError(f"bad response from server: {err}"))

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._fail_all(self.refusal or ConnectionLostError(f"connection lost: {exc or 'closed'}"))

    def _fail_all(self, err: DLedgerError) -> None:
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_exception(err)
        self.waiting.clear()

    def request(self, kind: int, *args: Any) -> tuple[int, asyncio.Future[Response]]:
        rid = next(self.ids)
        fut: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        if self.refusal is not None:  # refused before this request was made: not sent
            fut.set_exception(self.refusal)
            return rid, fut
        self.waiting[rid] = fut
        payload = encode_request(kind, rid, *args)
        signer = self.signer
        self.send_payload(payload if signer is None else signer.wrap(rid, self.target, payload))
        return rid, fut

    def expire(self, rid: int, node: str) -> None:
        """The request's deadline passed: fail it and forget it (a late answer is dropped)."""
        fut = self.waiting.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_exception(ProposalTimeoutError(f"no answer from {node} in time"))


class GroupClient:
    """Talks to the servers of one group; ``nodes`` maps node id -> client address.

    What it knows of the leader comes from the answers: a node that answers a leader-only
    request leads, a NOT_LEADER answer names the leader at the answering node's term. ``term``
    is the highest term any answer (or accepted route) showed; a hint at an older term is
    stale and ignored. A node that let a request time out is *silent* (paused, cut off) until
    it answers anything again: it is not taken as leader, from a hint at the term it went silent
    in or from a route (``suggest``), and it is dialled only after the other nodes, once
    ``silent_grace_s`` has passed; a hint naming it at that term ``leads_proof_s`` after its
    unanswered request was sent brings it back (see ``LEADS_PROOF_S``).
    ``stale_leader_canary`` (tests only) brings back the old rules the chaos suite must catch:
    a success teaches nothing, the route re-seeds the leader, silence is forgotten after 5 s.
    (The old code re-seeded only a client that knew no leader, so it kept dialling the silent
    node only when its first success after the silence needed no redirect, about half of the
    events; the canary re-seeds at every use of the route so that every run shows the bug.)
    ``ssl_context``: speak TLS to every node (``protocol.tls.dial_context``), its certificate
    checked against the host dialed; a failed handshake raises ``TlsError`` at once.
    """

    def __init__(self, nodes: dict[str, Address], timeout_s: float = 3.0,
                 connect_timeout_s: float = 1.0, *, silent_grace_s: float = SILENT_GRACE_S,
                 leads_proof_s: float = LEADS_PROOF_S,
                 stale_leader_canary: bool = False, credentials: Credentials | None = None,
                 ssl_context: ssl.SSLContext | None = None, group: str = "") -> None:
        if not nodes:
            raise ValueError("no nodes given")
        self.nodes = dict(nodes)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.ssl_context = ssl_context
        self.leader: str | None = None
        self.term = 0
        self._conns: dict[str, Connection] = {}
        self.redirects = 0
        self.silent_grace_s = silent_grace_s
        self.leads_proof_s = leads_proof_s
        # node -> (term known, suspected at, its unanswered request sent at) while silent
        self._silent: dict[str, tuple[int, float, float]] = {}
        self._canary = stale_leader_canary
        self._canary_until: dict[str, float] = {}  # canary: node -> when it is trusted again
        self._closes: dict[str, int] = {}  # node -> connections it closed in a row unanswered
        self._redial_at: dict[str, float] = {}  # node -> not dialled before (monotonic)
        self.push_handler: PushHandler | None = None  # for connections made from now on
        # Requests are signed with these, if given: a signing session per connection (frames on
        # one connection arrive in order, so its sequence rises at the node), each signature
        # naming "group/node" (the group of these nodes: a request is never good at another)
        self._credentials = credentials
        self.group = group

    def set_push_handler(self, handler: PushHandler | None) -> None:
        """Where server-initiated frames go, on the connections open and those to come."""
        self.push_handler = handler
        for conn in self._conns.values():
            conn.push_handler = handler

    async def close(self) -> None:
        for conn in self._conns.values():
            if conn.transport is not None:
                conn.transport.close()
        self._conns.clear()

    async def __aenter__(self) -> GroupClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- requests to one node ---------------------------------------------------------------------

    async def _conn(self, node: str, deadline: float) -> Connection:
        conn = self._conns.get(node)
        if conn is not None and conn.alive:
            return conn
        if node not in self.nodes:
            raise UnknownNodeError(f"unknown node {node!r} (known: {', '.join(sorted(self.nodes))})")
        host, port = self.nodes[node]
        await self._backoff(node, deadline)
        loop = asyncio.get_running_loop()
        budget = max(0.01, min(self.connect_timeout_s, deadline - time.monotonic()))
        signer = Signer(self._credentials) if self._credentials is not None else None
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the connection when
            # it is made in the same loop turn as a cancel of this task, and the cancel is lost
            # (a consumer's puller closed right after it took a new queue then pulled for ever)
            async with asyncio.timeout(budget):
                _, fresh = await loop.create_connection(
                    lambda: Connection(self.push_handler, signer, f"{self.group}/{node}"), host,
                    port, ssl=self.ssl_context,
                    server_hostname=host if self.ssl_context is not None else None)
        except SSLError as err:  # (an OSError) retrying elsewhere cannot help
            raise TlsError(f"TLS to {node} at {host}:{port} failed: {err}") from err
        except (OSError, TimeoutError) as err:
            raise NodeStoppedError(f"cannot connect to {node} at {host}:{port}: {err}") from err
        self._conns[node] = fresh
        return fresh

    async def call(self, node: str, kind: int, *args: Any, timeout_s: float | None = None) -> Any:
        """One request to one node; raises the named error of an error response."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        conn = await self._conn(node, deadline)
        rid, fut = conn.request(kind, *args)
        sent_at = time.monotonic()
        # A timer on the request itself: cheaper than wait_for on the hot path of every request.
        timer = asyncio.get_running_loop().call_later(
            max(0.001, deadline - sent_at), conn.expire, rid, node)
        try:
            resp = await fut
        except ConnectionLostError:
            self._closed_unanswered(node, conn)
            raise
        except ProposalTimeoutError as err:
            err.sent_at = sent_at  # (silence counts from here: see LEADS_PROOF_S)
            raise
        finally:
            timer.cancel()
        self._closes.pop(node, None)
        self._redial_at.pop(node, None)
        if not self._canary:
            self._silent.pop(node, None)  # it answered: no longer silent
        if not resp.ok:
            raise error_from(resp)
        return resp.result

    def _closed_unanswered(self, node: str, conn: Connection) -> None:
        """``conn`` to ``node`` was lost with a request in flight (counted once per
        connection): from the ``CLOSES_BEFORE_BACKOFF``-th in a row, suspect the node and pause
        before dialling it again (see ``CLOSE_BACKOFF_MIN_S``)."""
        if conn.close_counted:
            return
        conn.close_counted = True
        closes = self._closes[node] = self._closes.get(node, 0) + 1
        if closes < CLOSES_BEFORE_BACKOFF:
            return
        self.suspect(node)
        pause_s = min(CLOSE_BACKOFF_MAX_S,
                      CLOSE_BACKOFF_MIN_S * 2 ** min(closes - CLOSES_BEFORE_BACKOFF, 16))
        self._redial_at[node] = time.monotonic() + random.uniform(pause_s / 2, pause_s)

    async def _backoff(self, node: str, deadline: float) -> None:
        """Wait out ``node``'s pause before it is dialled again, within ``deadline``; a pause
        that outlasts it raises ``NodeStoppedError`` (nothing was sent)."""
        wait_s = self._redial_at.get(node, 0.0) - time.monotonic()
        if wait_s <= 0:
            return
        await asyncio.sleep(max(0.0, min(wait_s, deadline - time.monotonic())))
        if time.monotonic() < self._redial_at.get(node, 0.0):
            raise NodeStoppedError(f"{node} closed its last {self._closes.get(node, 0)} "
                                   "connections before answering: not dialled again yet")

    # -- requests to the leader, with redirects ----------------------------------------------------

    async def call_leader(self, kind: int, *args: Any,
                          timeout_s: float | None = None) -> tuple[str, Any]:
        """One request to the leader, following NOT_LEADER redirects until the deadline. Only
        a request that certainly was not acted on (redirected, or never sent) is retried.

        The known leader is asked first, else the nodes in turn, a silent one only after its
        grace (see the class)."""
        now = time.monotonic()
        deadline = now + (timeout_s or self.timeout_s)
        tried: list[str] = []
        last_err: DLedgerError | None = None
        while now < deadline:
            node = self._next_node(len(tried), now)
            tried.append(node)
            try:
                result = await self.call(node, kind, *args, timeout_s=max(0.001, deadline - now))
            except ProposalTimeoutError as err:  # silent (paused, partitioned, overloaded): outcome unknown
                self.suspect(node, unanswered_since=err.sent_at)
                raise
            except NotLeaderError as err:  # certainly not appended: follow the hint at once
                last_err = err
                self.redirects += 1
                if err.leader_hint and err.leader_hint not in self.nodes:
                    raise UnknownLeaderError(err.leader_hint) from err
                self._not_leader(node, err.leader_hint, err.term)
                if self.leader is None:
                    await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
            except (NodeStoppedError, DiskFullError) as err:  # not appended: could not
                last_err = err  # connect, the node refused, or its disk is full
                # It cannot serve now (down, refusing, or no room until its disk has some):
                # the others first, and a route still naming it does not put it back first.
                self.suspect(node)
                await asyncio.sleep(min(0.02, max(0.0, deadline - time.monotonic())))
            else:
                if not self._canary:
                    self.leader = node  # it answered a leader-only request: it leads
                return node, result
            now = time.monotonic()
        raise UnavailableError(f"no leader answered within the deadline (tried {tried[-6:]}): "
                               f"{last_err}")

    def _not_leader(self, node: str, hint: str | None, term: int) -> None:
        """``node`` says it does not lead, and that ``hint`` leads at ``term`` (0: not said)."""
        if self.leader == node:
            self.leader = None
        if self._canary:
            self.leader = hint
            return
        if term and term < self.term:
            return  # that node has not heard of the latest election: its hint is stale
        self.term = max(self.term, term)
        silent = self._silent.get(hint) if hint is not None else None
        if hint is not None and silent is not None and (not term or term <= silent[0]):
            if not term or time.monotonic() - silent[2] < self.leads_proof_s:
                return  # the silent node, at the term it went silent in: an election may be under way
            del self._silent[hint]  # its peers still follow it (LEADS_PROOF_S): it leads
        self.leader = hint

    def suggest(self, leader: str | None, term: int) -> None:
        """A route names ``leader`` at ``term``. Taken only when it tells more than the answers
        did: a newer term, or the same term while no leader is known; never a silent node."""
        if leader not in self.nodes:
            return
        if self._canary:
            self.leader = leader  # the route's word wins, every time it is read
            return
        if leader in self._silent or term < self.term or (term == self.term and self.leader):
            return
        self.leader, self.term = leader, term

    def suspect(self, node: str, unanswered_since: float | None = None) -> None:
        """``node`` did not answer in time (a request sent at ``unanswered_since``, monotonic;
        None: now): stop assuming it leads, and try the others first until it answers again
        or a hint shows it leads (a paused or cut-off leader would otherwise hold every request
        until its deadline)."""
        if self.leader == node:
            self.leader = None
        now = time.monotonic()
        if self._canary:
            self._canary_until[node] = now + CANARY_SUSPECT_S
        self._silent[node] = (self.term, now, now if unanswered_since is None else unanswered_since)

    def is_silent(self, node: str) -> bool:
        if self._canary:
            return self._canary_until.get(node, 0.0) > time.monotonic()
        return node in self._silent

    def candidates(self) -> list[str]:
        """The nodes in the order to try them: the known leader, the others, the silent ones."""
        leader = self.leader
        rest = sorted(self.nodes, key=lambda n: (self.is_silent(n), n))
        if leader is not None and leader in self.nodes:
            rest.remove(leader)
            rest.insert(0, leader)
        return rest

    def _next_node(self, k: int, now: float) -> str:
        """The node for a call_leader's ``k``-th try."""
        leader = self.leader
        if leader is not None and leader in self.nodes:
            return leader
        order = self.candidates()
        if not self._canary:
            grace_over = now - self.silent_grace_s
            ready = [n for n in order if self._silent.get(n, (0, -math.inf, 0.0))[1] <= grace_over]
            order = ready or order  # every node silent: the least bad choice is still a choice
        return order[k % len(order)]
