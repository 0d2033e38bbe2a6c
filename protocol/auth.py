"""Signed requests: the envelope a client with credentials wraps each request in, and its checks.

Owns ``Credentials`` (an access key and its secret; never shown by ``repr``), the ``Signer`` a
client connection uses, the SIGNED frame's layout and its parsing, and the pure parts of the
check a server makes: the HMAC, the clock window, and the per-session sequence that refuses a
replay (``ReplayGuard``). Who may do what is the broker's ACL (``broker.features.acl.model``).

A SIGNED frame is ``[VERSION, SIGNED, request_id, access_key, target, session, seq, ts_ms,
signature, inner]``: ``inner`` is the request's own frame payload, byte for byte, under the same
request id; ``target`` the "group/node" it is meant for (a request replayed to another node,
of this group or another, is refused); ``session`` 16 random bytes a signer draws once (a client
has one signer per connection, so the node sees a session's frames in order), ``seq`` a number
it counts up per request, ``ts_ms`` the signer's clock. The signature is HMAC-SHA256 with the secret over
``cbor([SIGN_CONTEXT, access_key, target, session, seq, ts_ms]) + inner``.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import cbor2

from protocol.auth_rules import check_access_key, check_secret_key
from protocol.errors import DLedgerError
from protocol.frames import encode_payload

__all__ = [
    "ACCESS_KEY_ENV", "SECRET_KEY_ENV", "SIGNED", "AccessDeniedError", "Credentials",
    "ReplayGuard", "SignatureError", "SignedRequest", "Signer", "parse_signed", "signature_of",
]

SIGNED = 90  # the request kind of the envelope (the log server's kinds are 64..70, a broker's 100+)
SIGN_CONTEXT = "dledger-sign-1"
SESSION_BYTES = 16
SIGNATURE_BYTES = 32
TARGET_CHARS_MAX = 64
REPLAY_WINDOW_MS_DEFAULT = 60_000  # a signature's clock may be this far from the server's
SESSIONS_MAX_DEFAULT = 100_000  # signing sessions one node remembers within the window
SESSIONS_PER_KEY_MAX_DEFAULT = 10_000  # ... of one access key
INT_MAX = 2**63 - 1
ACCESS_KEY_ENV = "DLEDGER_ACCESS_KEY"
SECRET_KEY_ENV = "DLEDGER_SECRET_KEY"


class SignatureError(DLedgerError):
    """A request's signature was refused: missing, malformed, an unknown access key, a wrong
    secret, a clock outside the window, meant for another node, or a replay."""

    code = "SIGNATURE_REFUSED"


class AccessDeniedError(DLedgerError):
    """The account may not do this: the topic or group's permission, or an admin operation."""

    code = "ACCESS_DENIED"


@dataclass(frozen=True, slots=True)
class Credentials:
    access_key: str
    secret_key: str

    def __post_init__(self) -> None:
        check_access_key(self.access_key)
        check_secret_key(self.secret_key)

    def __repr__(self) -> str:  # the secret never reaches a log or a traceback
        return f"Credentials(access_key={self.access_key!r}, secret_key=<hidden>)"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Credentials | None:
        """``DLEDGER_ACCESS_KEY`` and ``DLEDGER_SECRET_KEY``, or None when neither is set."""
        env = os.environ if env is None else env
        key, secret = env.get(ACCESS_KEY_ENV), env.get(SECRET_KEY_ENV)
        if not key and not secret:
            return None
        if not key or not secret:
            raise ValueError(f"set both {ACCESS_KEY_ENV} and {SECRET_KEY_ENV}, or neither")
        return cls(key, secret)


def signature_of(secret_key: str, access_key: str, target: str, session: bytes, seq: int,
                 ts_ms: int, inner: bytes) -> bytes:
    head = cbor2.dumps([SIGN_CONTEXT, access_key, target, session, seq, ts_ms])
    return hmac.new(secret_key.encode(), head + inner, hashlib.sha256).digest()


class Signer:
    """Signs one client's requests: one session, its sequence counting up."""

    def __init__(self, credentials: Credentials, clock_s: Callable[[], float] = time.time) -> None:
        self.credentials = credentials
        self.session = os.urandom(SESSION_BYTES)
        self._seq = itertools.count(1)
        self._clock_s = clock_s

    def wrap(self, request_id: int, target: str, inner: bytes) -> bytes:
        c = self.credentials
        seq, ts_ms = next(self._seq), int(self._clock_s() * 1000)
        sig = signature_of(c.secret_key, c.access_key, target, self.session, seq, ts_ms, inner)
        return encode_payload(SIGNED, [request_id, c.access_key, target, self.session, seq, ts_ms,
                                       sig, inner])


@dataclass(frozen=True, slots=True)
class SignedRequest:
    request_id: int
    access_key: str
    target: str
    session: bytes
    seq: int
    ts_ms: int
    signature: bytes
    inner: bytes

    def verify(self, secret_key: str) -> bool:
        expected = signature_of(secret_key, self.access_key, self.target, self.session, self.seq,
                                self.ts_ms, self.inner)
        return hmac.compare_digest(expected, self.signature)


def parse_signed(request_id: int, fields: list[Any]) -> SignedRequest:
    """The envelope's fields after its request id, each checked; SignatureError if malformed."""
    if len(fields) != 7:
        raise SignatureError("a signed request has 7 fields after its id")
    key, target, session, seq, ts_ms, sig, inner = fields
    try:
        check_access_key(key)
    except ValueError as err:
        raise SignatureError(f"malformed access key: {err}") from None
    if not isinstance(target, str) or len(target) > TARGET_CHARS_MAX:
        raise SignatureError("the target is a node id")
    if not isinstance(session, bytes) or len(session) != SESSION_BYTES:
        raise SignatureError(f"the session is {SESSION_BYTES} bytes")
    for name, v in (("seq", seq), ("ts_ms", ts_ms)):
        if type(v) is not int or not 0 < v <= INT_MAX:
            raise SignatureError(f"{name} is a positive integer")
    if not isinstance(sig, bytes) or len(sig) != SIGNATURE_BYTES:
        raise SignatureError(f"the signature is {SIGNATURE_BYTES} bytes")
    if not isinstance(inner, bytes):
        raise SignatureError("the signed request is bytes")
    return SignedRequest(request_id, key, target, session, seq, ts_ms, sig, inner)


class ReplayGuard:
    """The per-node memory that refuses a replayed or stale signature: a signature's clock must be
    within ``window_ms`` of this node's, and each session's sequence must rise. A session is
    forgotten once its last request is older than the window (its frames are stale by then),
    oldest first. At most ``sessions_max`` are remembered, and at most ``per_key_max`` of one
    access key (so that one account cannot crowd out the others); a new session past either is
    refused, except one of an ``exempt`` account (the bootstrap admins), so an operator is never
    locked out."""

    def __init__(self, window_ms: int = REPLAY_WINDOW_MS_DEFAULT,
                 sessions_max: int = SESSIONS_MAX_DEFAULT,
                 per_key_max: int = SESSIONS_PER_KEY_MAX_DEFAULT) -> None:
        self.window_ms = window_ms
        self.sessions_max = sessions_max
        self.per_key_max = per_key_max
        # (access key, session) -> (last seq, last ts), least recently used first
        self._sessions: OrderedDict[tuple[str, bytes], tuple[int, int]] = OrderedDict()
        self._per_key: dict[str, int] = {}

    def check(self, req: SignedRequest, now_ms: int, exempt: bool = False) -> None:
        """Raise SignatureError for a stale or replayed request, else remember it."""
        if abs(now_ms - req.ts_ms) > self.window_ms:
            raise SignatureError(f"the signature's clock is {abs(now_ms - req.ts_ms)} ms from "
                                 f"the node's (the window is {self.window_ms} ms)")
        key = (req.access_key, req.session)
        last = self._sessions.get(key)
        if last is not None and req.seq <= last[0]:
            raise SignatureError(f"a replayed request (sequence {req.seq}, the session is at "
                                 f"{last[0]})")
        if last is None:
            self._forget_before(now_ms - self.window_ms)
            full = len(self._sessions) >= self.sessions_max or \
                self._per_key.get(req.access_key, 0) >= self.per_key_max
            if full and not exempt:
                    raise SignatureError("too many signing sessions on this node: try later")
            self._per_key[req.access_key] = self._per_key.get(req.access_key, 0) + 1
        self._sessions[key] = (req.seq, max(req.ts_ms, last[1] if last else 0))
        self._sessions.move_to_end(key)

    def _forget_before(self, ts_ms: int) -> None:
        """Drop the sessions whose last request is older than ``ts_ms``: from the least recently
        used end, stopping at the first younger one (each is dropped once: amortised O(1))."""
        sessions = self._sessions
        while sessions:
            key, (_, ts) = next(iter(sessions.items()))
            if ts >= ts_ms:
                return
            del sessions[key]
            left = self._per_key[key[0]] - 1
            if left:
                self._per_key[key[0]] = left
            else:
                del self._per_key[key[0]]

    def __len__(self) -> int:
        return len(self._sessions)
