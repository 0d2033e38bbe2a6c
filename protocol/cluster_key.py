"""The cluster credential: the secret a NameServer and its broker nodes share, and the signature
a node puts on every registration and unregistration it sends.

Owns where the credential comes from (a file, mode 0600, made by ``generate_key_file``; or the
environment variable ``DLEDGER_CLUSTER_KEY``), the signed headers' layout, and the pure parts
of the check a NameServer makes (``verify``): the HMAC, the clock window, and the nonces seen
within it (``NonceCache``), so a captured request is refused when sent again. The HTTP shells
(the broker's registrar, the NameServer's handlers) only move headers and bytes.

A signed request carries four headers: ``X-DLedger-Node`` ("group/node_id": who signs),
``X-DLedger-Time`` (the signer's wall clock, Unix ms), ``X-DLedger-Nonce`` (32 random hex
digits) and ``X-DLedger-Signature``: HMAC-SHA256 with the credential, in hex, over
``SIGN_CONTEXT, method, path, node, time, nonce, SHA-256 of the body`` joined by newlines.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from protocol.errors import DLedgerError

__all__ = [
    "CLUSTER_KEY_ENV", "KEY_FILE_ENV", "KEY_FILE_NAME", "BadClusterSignatureError",
    "ClusterKeyError", "NonceCache", "ReplayedRequestError", "SignedBy", "UnsignedRequestError",
    "generate_key_file", "load_cluster_key", "sign_headers", "status_headers", "verify",
]

CLUSTER_KEY_ENV = "DLEDGER_CLUSTER_KEY"  # the credential itself
KEY_FILE_ENV = "DLEDGER_CLUSTER_KEY_FILE"  # a file holding it
KEY_FILE_NAME = "cluster.key"  # in ``dledger up``'s data directory
KEY_CHARS_MIN = 32  # a credential shorter than this is refused (guessable)
KEY_CHARS_MAX = 4096
SIGN_CONTEXT = "dledger-cluster-v1"
WINDOW_MS_DEFAULT = 60_000  # a signed request's clock may differ from the checker's this much
NONCES_MAX_DEFAULT = 100_000  # remembered within the window (about 30 registrations/s per window)
STATUS_READER = "status/reader"  # who signs a read of a broker's /status (``--protect-status``)
NODE, TIME, NONCE, SIGNATURE = ("X-DLedger-Node", "X-DLedger-Time", "X-DLedger-Nonce",
                                "X-DLedger-Signature")


class ClusterKeyError(DLedgerError):
    """The credential cannot be read, or is not one (too short, too long, not text)."""


class UnsignedRequestError(DLedgerError):
    """A request that must be signed carries no signature (HTTP 401)."""


class BadClusterSignatureError(DLedgerError):
    """A signature that does not check: wrong credential, altered request, malformed headers,
    or a clock outside the window (HTTP 403)."""


class ReplayedRequestError(BadClusterSignatureError):
    """A signed request seen before, within the window (HTTP 403)."""


def _checked(text: str, where: str) -> bytes:
    key = text.strip()
    if not KEY_CHARS_MIN <= len(key) <= KEY_CHARS_MAX:
        raise ClusterKeyError(f"the cluster credential from {where} has {len(key)} characters: "
                              f"it needs {KEY_CHARS_MIN} to {KEY_CHARS_MAX}")
    return key.encode()


def load_cluster_key(path: str | None, environ: Mapping[str, str]) -> bytes | None:
    """The credential from ``path``, else from the file ``$DLEDGER_CLUSTER_KEY_FILE``, else from
    ``$DLEDGER_CLUSTER_KEY``; None when none is given. A file others may read is refused."""
    path = path or environ.get(KEY_FILE_ENV) or None
    if path is None:
        raw = environ.get(CLUSTER_KEY_ENV)
        return _checked(raw, f"${CLUSTER_KEY_ENV}") if raw else None
    try:
        with open(path, encoding="utf-8") as f:
            mode = os.fstat(f.fileno()).st_mode
            text = f.read(KEY_CHARS_MAX + 2)
    except (OSError, UnicodeDecodeError) as err:
        raise ClusterKeyError(f"cannot read the cluster credential {path}: {err}") from err
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ClusterKeyError(f"the cluster credential {path} is readable by others (mode "
                              f"{stat.S_IMODE(mode):o}): chmod 600 it")
    return _checked(text, path)


def generate_key_file(path: str) -> bytes:
    """The credential in ``path``, made there first (mode 0600, 64 random hex digits) if it
    is not there yet."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = load_cluster_key(path, {})
        assert key is not None
        return key
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(secrets.token_hex(32) + "\n")
    key = load_cluster_key(path, {})
    assert key is not None
    return key


def _signature(key: bytes, method: str, path: str, node: str, time_ms: str, nonce: str,
               body: bytes) -> str:
    text = "\n".join((SIGN_CONTEXT, method.upper(), path, node, time_ms, nonce,
                      hashlib.sha256(body).hexdigest()))
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def sign_headers(key: bytes, method: str, path: str, node: str, body: bytes, now_ms: int,
                 nonce: str | None = None) -> dict[str, str]:
    """The headers that sign one request of ``node`` ("group/node_id")."""
    nonce = nonce or secrets.token_hex(16)
    return {NODE: node, TIME: str(now_ms), NONCE: nonce,
            SIGNATURE: _signature(key, method, path, node, str(now_ms), nonce, body)}


def status_headers(key: bytes | None, now_ms: int) -> dict[str, str]:
    """The headers of a ``GET /status`` to a broker started with ``--protect-status`` (none
    without a credential)."""
    return {} if key is None else sign_headers(key, "GET", "/status", STATUS_READER, b"", now_ms)


class NonceCache:
    """The nonces of the requests accepted within the window, each until its time plus the
    window: a replay within it is recognised; one after it fails the clock check. Bounded:
    when full of unexpired nonces, a new request is refused rather than one forgotten."""

    def __init__(self, window_ms: int = WINDOW_MS_DEFAULT,
                 nonces_max: int = NONCES_MAX_DEFAULT) -> None:
        self.window_ms = window_ms
        self.nonces_max = nonces_max
        self._until: OrderedDict[str, int] = OrderedDict()  # nonce -> forget after (ms)

    def __len__(self) -> int:
        return len(self._until)

    def admit(self, nonce: str, signed_ms: int, now_ms: int) -> None:
        """Remember ``nonce``; ``ReplayedRequestError`` if it is remembered already."""
        while self._until and next(iter(self._until.values())) < now_ms:
            self._until.popitem(last=False)  # (in order of arrival: bounded by the count)
        if nonce in self._until:
            raise ReplayedRequestError(f"nonce {nonce} was seen before: a replayed request")
        if len(self._until) >= self.nonces_max:
            raise BadClusterSignatureError(f"{self.nonces_max} signed requests within the "
                                           "window already: refused, try again later")
        # kept while the signed clock is within the window of now: arrival order keeps the
        # queue's head the soonest to expire within one window's skew
        self._until[nonce] = max(signed_ms, now_ms) + self.window_ms


@dataclass(frozen=True, slots=True)
class SignedBy:
    """Who signed a request that checked: its group and node id."""

    group: str
    node_id: str


def verify(key: bytes, headers: Mapping[str, str], method: str, path: str, body: bytes,
           now_ms: int, nonces: NonceCache) -> SignedBy:
    """Who signed this request, if its signature checks with ``key``, its clock is within the
    window of ``now_ms`` and its nonce is new; else ``UnsignedRequestError`` (no signature) or
    ``BadClusterSignatureError`` naming what failed."""
    signature = headers.get(SIGNATURE)
    if signature is None:
        raise UnsignedRequestError("this request must be signed with the cluster credential "
                                   f"(headers {NODE}, {TIME}, {NONCE}, {SIGNATURE})")
    node, time_ms, nonce = headers.get(NODE, ""), headers.get(TIME, ""), headers.get(NONCE, "")
    group, _, node_id = node.partition("/")
    if not (group and node_id and len(node) <= 200 and time_ms.isdigit() and len(time_ms) <= 15
            and 16 <= len(nonce) <= 64 and nonce.isalnum()):
        raise BadClusterSignatureError(f"malformed signature headers ({NODE} group/node_id, "
                                       f"{TIME} Unix ms, {NONCE} 16-64 letters or digits)")
    want = _signature(key, method, path, node, time_ms, nonce, body)
    if not hmac.compare_digest(want, signature):
        raise BadClusterSignatureError(f"the signature of {node} does not check: another "
                                       "credential, or the request was altered")
    if abs(int(time_ms) - now_ms) > nonces.window_ms:
        raise BadClusterSignatureError(
            f"the request of {node} was signed at {time_ms} ms, {int(time_ms) - now_ms:+d} ms "
            f"from this clock: outside the {nonces.window_ms} ms window (clocks differ, or a "
            "replay)")
    nonces.admit(nonce, int(time_ms), now_ms)
    return SignedBy(group, node_id)
