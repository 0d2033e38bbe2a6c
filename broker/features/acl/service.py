"""Access control at the door of every broker node: signatures checked, then permissions.

Owns ``AclService.admit`` (run for each request a client connection brings, before dispatch: a
SIGNED envelope opened, its signature, target node, clock and sequence checked (``protocol.auth``),
and what the inner request needs (``NEEDS``, one line per request kind) checked against the
account (``broker.features.acl.model``)), the refusal log (rate-limited, naming the account, never a secret),
and the bootstrap admins' credentials (``credentials_of``). The ACL's requests are
``broker.features.acl.handlers``.

Off (the default, no ``--acl``) a signed request is served as the request it wraps, unchecked;
on, an unsigned one is refused. The accounts are the replicated table plus the bootstrap admins
the node was started with (``--acl-admin-key`` and its secret from the environment): give every
node of a group the same.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from broker.features.acl.model import ADMIN, PUB, SUB, Account, Need, permits
from broker.features.host import BrokerHost
from protocol.auth import (
    SIGNED,
    AccessDeniedError,
    Credentials,
    ReplayGuard,
    SignatureError,
    parse_signed,
)
from protocol.auth_rules import check_access_key
from protocol.broker_errors import BadRequestError
from protocol.broker_kinds import (
    ACL_DELETE,
    ACL_LIST,
    ACL_PUT,
    BROKER_STATUS,
    CONSUME_DIRECTLY,
    CONSUMER_RUNNING_INFO,
    CONSUMER_STATUS,
    DLQ_RESEND,
    END_TRANSACTION,
    HEARTBEAT,
    LOCK_BATCH,
    MEMBER_ADD,
    MEMBER_PROMOTE,
    MEMBER_REMOVE,
    OFFSET_COMMIT,
    OFFSET_QUERY,
    OFFSET_RESET,
    POP_ACK,
    POP_CHANGE,
    POP_DEAD,
    POP_RECEIVE,
    PRODUCER_HEARTBEAT,
    PULL,
    PULL_SQL,
    QUERY_BY_KEY,
    QUERY_BY_TIME,
    QUERY_BY_UNIQUE_KEY,
    RECALL,
    SEARCH_OFFSET,
    SEND,
    SEND_BACK,
    SEND_RUNS,
    STATE_DIGEST,
    SUBSCRIPTION_GROUP_GET,
    SUBSCRIPTION_GROUP_PUT,
    TOPIC_DELETE,
    TOPIC_PUT,
    TRANSFER_LEADERSHIP,
    TXN_HALF,
    UNLOCK_BATCH,
    VIEW_MESSAGE,
)
from protocol.envelope import Request, decode_request
from protocol.errors import NotLeaderError, WireError

__all__ = ["NEEDS", "AclService", "credentials_of"]

log = logging.getLogger("broker.features.acl")

# A seeded bug (tests only): an ACL change is made on the leader's table alone, not through
# the log, so a new leader does not know it (the live ACL checker must catch that).
REFUSALS_LOGGED_PER_S = 10  # refusal lines a node writes per second (the rest are counted)

NeedsOf = Callable[[list[Any]], list[Need]]


def _s(args: list[Any], i: int) -> str:
    v = args[i]
    if not isinstance(v, str):
        raise TypeError(f"argument {i} is a string")
    return v


def _topic(i: int, perm: int) -> NeedsOf:
    return lambda a: [Need("topic", _s(a, i), perm)]


def _group_topic(perm_topic: int = SUB) -> NeedsOf:
    """A consumer group's request on a topic: (group, topic, ...) args."""
    return lambda a: [Need("group", _s(a, 0), SUB), Need("topic", _s(a, 1), perm_topic)]


def _admin(_: list[Any]) -> list[Need]:
    return [ADMIN]


def _nothing(_: list[Any]) -> list[Need]:
    return []  # any account: a signed request is enough


def _runs(a: list[Any]) -> list[Need]:
    runs = a[0]
    if not isinstance(runs, list):
        raise TypeError("runs is a list")
    return [Need("topic", _s(r, 0), PUB) for r in runs]


def _heartbeat(a: list[Any]) -> list[Need]:
    subs = a[3]
    if not isinstance(subs, dict) or not all(isinstance(t, str) for t in subs):
        raise TypeError("subscriptions are {topic: expression}")
    return [Need("group", _s(a, 1), SUB), *(Need("topic", t, SUB) for t in subs)]


def _locks(a: list[Any]) -> list[Need]:
    queues = a[2]
    if not isinstance(queues, list):
        raise TypeError("queues are a list")
    return [Need("group", _s(a, 0), SUB), *(Need("topic", _s(q, 0), SUB) for q in queues)]


def _txn_half(a: list[Any]) -> list[Need]:
    return [Need("group", _s(a, 0), PUB), Need("topic", _s(a, 2), PUB)]


def _txn_end(a: list[Any]) -> list[Need]:
    offsets = a[4]
    if not isinstance(offsets, list):
        raise TypeError("offsets are a list")
    return [Need("group", _s(a, 0), PUB),
            *(n for o in offsets for n in (Need("group", _s(o, 0), SUB), Need("topic", _s(o, 1), SUB)))]


def _unique_key_query(a: list[Any]) -> list[Need]:
    topic = _s(a, 1)
    return [Need("topic", topic, SUB)] if topic else [ADMIN]


# What each request kind needs. Every kind a broker serves has a line (a test checks it), so a
# new kind cannot slip past: one without a line is refused.
NEEDS: dict[int, NeedsOf] = {
    SEND: _topic(0, PUB),
    SEND_RUNS: _runs,
    TXN_HALF: _txn_half,
    END_TRANSACTION: _txn_end,
    PRODUCER_HEARTBEAT: lambda a: [Need("group", _s(a, 1), PUB)],
    PULL: _topic(0, SUB),
    PULL_SQL: _topic(0, SUB),
    RECALL: _topic(0, PUB),  # a producer's recall of its delayed message
    SEARCH_OFFSET: _topic(0, SUB),
    QUERY_BY_KEY: _topic(0, SUB),
    QUERY_BY_TIME: _topic(0, SUB),
    QUERY_BY_UNIQUE_KEY: _unique_key_query,
    OFFSET_COMMIT: _group_topic(),
    OFFSET_QUERY: _group_topic(),
    SEND_BACK: _group_topic(),
    POP_RECEIVE: _group_topic(),
    POP_ACK: _group_topic(),
    POP_CHANGE: _group_topic(),
    POP_DEAD: _group_topic(),
    HEARTBEAT: _heartbeat,
    LOCK_BATCH: _locks,
    UNLOCK_BATCH: _locks,
    CONSUMER_STATUS: lambda a: [Need("group", _s(a, 0), SUB)],
    BROKER_STATUS: _nothing,  # clients find leaders and queues with it
    TOPIC_PUT: _admin, TOPIC_DELETE: _admin, OFFSET_RESET: _admin, DLQ_RESEND: _admin,
    TRANSFER_LEADERSHIP: _admin, VIEW_MESSAGE: _admin, STATE_DIGEST: _admin,
    MEMBER_ADD: _admin, MEMBER_PROMOTE: _admin, MEMBER_REMOVE: _admin,
    ACL_PUT: _admin, ACL_DELETE: _admin, ACL_LIST: _admin,
    CONSUMER_RUNNING_INFO: _admin, CONSUME_DIRECTLY: _admin,
    SUBSCRIPTION_GROUP_PUT: _admin, SUBSCRIPTION_GROUP_GET: _admin,
}

# The kinds only a leader serves: a follower answers NOT_LEADER before it looks at the account,
# so that a write is judged by the leader's ACL (a follower's may lag it by an entry or two).
# (A kind missing here is still safe: its handler redirects after a follower's check.)
LEADER_ONLY = frozenset({
    SEND, SEND_RUNS, TXN_HALF, END_TRANSACTION, OFFSET_COMMIT, SEND_BACK, DLQ_RESEND, LOCK_BATCH,
    UNLOCK_BATCH, TOPIC_PUT, TOPIC_DELETE, OFFSET_RESET, TRANSFER_LEADERSHIP, MEMBER_ADD,
    MEMBER_PROMOTE, MEMBER_REMOVE, POP_RECEIVE, POP_ACK, POP_CHANGE, POP_DEAD, ACL_PUT, ACL_DELETE,
    ACL_LIST, SUBSCRIPTION_GROUP_PUT, SUBSCRIPTION_GROUP_GET})


class AclService:
    """Checks each request a node serves (``admit``) while ``--acl`` is on."""

    def __init__(self, host: BrokerHost, served_kinds: frozenset[int]) -> None:
        cfg = host.config
        self.host = host
        self.enabled = cfg.acl
        self.target = f"{cfg.node.group}/{cfg.node.node_id}"  # what a signature must name
        self.admins = {c.access_key: Account(c.access_key, c.secret_key, admin=True)
                       for c in cfg.acl_admins}
        self.guard = ReplayGuard(cfg.acl_replay_window_ms)
        self.served_kinds = served_kinds
        self._log_second = 0
        self._logged = 0

    def account(self, access_key: str) -> Account | None:
        return self.admins.get(access_key) or self.host.state.acl.get(access_key)

    def admit(self, req: Request) -> Request:
        """The request to serve: ``req``, or the one its envelope wraps, checked when ACL is on.
        Raises SignatureError, AccessDeniedError or BadRequestError (the caller answers it)."""
        if req.kind != SIGNED:
            if not self.enabled:
                return req
            raise self._refused(SignatureError(
                "access control is on: the request must be signed (give an access key and "
                "secret: --access-key, or DLEDGER_ACCESS_KEY and DLEDGER_SECRET_KEY)"), "-", req)
        signed = parse_signed(req.request_id, req.args)  # (raises SignatureError)
        try:
            inner = decode_request(signed.inner, self.served_kinds)
        except WireError as err:
            raise SignatureError(f"the signed request does not decode: {err}") from None
        if inner.request_id != req.request_id:
            raise SignatureError("the signed request's id differs from its envelope's")
        if not self.enabled:
            return inner
        key = signed.access_key
        account = self.account(key)
        if account is None or not signed.verify(account.secret_key):
            # (one answer for both: which access keys exist is not told to a stranger)
            raise self._refused(SignatureError(
                "unknown access key or wrong secret: the signature does not match"), key, inner)
        if signed.target != self.target:
            raise self._refused(SignatureError(
                f"signed for {signed.target!r}, not this node ({self.target!r})"), key, inner)
        try:  # (recorded before anything is answered, a redirect included: never replayed)
            self.guard.check(signed, int(time.time() * 1000), exempt=key in self.admins)
        except SignatureError as err:
            raise self._refused(err, key, inner) from None
        self._authorize(account, inner.kind, inner.args, inner)
        return inner

    def permit(self, access_key: str | None, kind: int, args: list[Any],
               leader_rule: bool = True) -> None:
        """A front end's request as an account it authenticated itself (RocketMQ 4.x clients
        sign over the remoting protocol): refused by name unless that account may make it
        (``leader_rule``: and NOT_LEADER where a write must wait for the leader's judgement)."""
        req = Request(kind, 0, args)
        if access_key is None:
            raise self._refused(SignatureError(
                "access control is on: the request must be signed (a RocketMQ client: its "
                "AccessKey and SecretKey, sent as AccessKey and Signature)"), "-", req)
        account = self.account(access_key)
        if account is None:
            raise self._refused(SignatureError(
                "unknown access key or wrong secret: the signature does not match"),
                access_key, req)
        self._authorize(account, kind, args, req, leader_rule)

    def credentials(self, access_key: str) -> Credentials:
        """The account's credentials, to sign a forward as it (``permit`` let it in)."""
        account = self.account(access_key)
        if account is None:
            raise SignatureError(f"access key {access_key!r} is no longer an account")
        return Credentials(account.access_key, account.secret_key)

    def _authorize(self, account: Account, kind: int, args: list[Any], req: Request,
                   leader_rule: bool = True) -> None:
        key = account.access_key
        if leader_rule:
            self._check_current(kind)
        needs_of = NEEDS.get(kind)
        if needs_of is None:
            raise self._refused(AccessDeniedError(f"request kind {kind} has no permission "
                                                  f"rule: refused"), key, req)
        try:
            needs = needs_of(args)
        except (IndexError, TypeError, ValueError, KeyError) as err:
            raise BadRequestError(f"request kind {kind}: malformed arguments ({err})") from None
        reason = permits(account, needs)
        if reason is not None:
            raise self._refused(AccessDeniedError(f"access key {key!r} may not: needs {reason}"),
                                key, req)

    def _check_current(self, kind: int) -> None:
        """Writes are decided by the leader's ACL, and a leader's ACL holds every earlier commit:
        a follower answers NOT_LEADER to a leader-only kind at once, and a new leader does until
        it has applied its own term's first entry (an ACL change its predecessor acknowledged
        may be in its log but not applied yet; a few milliseconds): the client tries again.
        (A follower's reads follow its own apply, as its data does.)"""
        node = self.host.node
        core = node.core
        if core is None or node.disk_full is not None:  # (its handlers name the full disk)
            return
        if kind not in LEADER_ONLY:
            return  # reads: judged by this node's ACL as it has applied it, as its data is
        if not node.is_leader:
            raise NotLeaderError(core.leader_id, core.term)
        if self.host.state.applied_index < core.term_start_index:
            raise NotLeaderError(None, core.term)

    def _refused(self, err: SignatureError | AccessDeniedError, key: str,
                 req: Request) -> SignatureError | AccessDeniedError:
        reason = "signature" if isinstance(err, SignatureError) else "denied"
        now_s = int(time.monotonic())
        if now_s != self._log_second:
            self._log_second, self._logged = now_s, 0
        if self._logged < REFUSALS_LOGGED_PER_S:
            self._logged += 1
            log.warning("request refused: account=%s kind=%d: %s", key, req.kind, err,
                        extra={"account": key, "request_kind": req.kind, "refusal": reason})
        return err


def credentials_of(admins: list[str]) -> tuple[Credentials, ...]:
    """The bootstrap admins from ``--acl-admin-key KEY`` options, each secret from the
    environment variable DLEDGER_ACL_SECRET_<KEY> (upper case, '-' and '.' as '_'): secrets are
    never on a command line, which other users of the machine can read."""
    out = []
    for key in admins:
        check_access_key(key)
        env = "DLEDGER_ACL_SECRET_" + key.upper().replace("-", "_").replace(".", "_")
        secret = os.environ.get(env)
        if not secret:
            raise ValueError(f"--acl-admin-key {key}: set its secret in ${env}")
        out.append(Credentials(key, secret))
    return tuple(out)
