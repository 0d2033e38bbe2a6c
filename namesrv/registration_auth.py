"""Who may register: the NameServer's check that a registration or an unregistration was signed
by a node holding the cluster credential (``protocol.cluster_key``), and signed for the node
it names.

Three ways a NameServer runs:
- with a credential (``dledger up`` makes one; ``--cluster-key-file`` or
  ``$DLEDGER_CLUSTER_KEY``): every registration and unregistration must be signed with it.
  Unsigned: 401; a signature that does not check, a clock outside the window, a replay, or a
  node signing for another node: 403. Nothing changes in the registry;
- with no credential: every registration is refused (401), saying how to give one;
- with ``--insecure``: unsigned ones are accepted too (a signed one is still checked when the
  NameServer has a credential). Its log says so at start, and ``/readyz`` shows it.

Owns the guard's state (the nonces seen within the window, the counts of refusals) and the
mapping from a request's headers to the check; the HTTP handlers call ``check``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from protocol.cluster_key import (
    CLUSTER_KEY_ENV,
    WINDOW_MS_DEFAULT,
    BadClusterSignatureError,
    NonceCache,
    UnsignedRequestError,
    verify,
)

__all__ = ["NAMESRV_CANARIES", "RegistrationGuard"]

# The seeded bug the live chaos checker of registrations must catch (tests only): the guard
# takes every request without looking at its signature (chaos.live.checkers.registrations).
NAMESRV_CANARIES = frozenset({"namesrv_skip_signature"})

log = logging.getLogger(__name__)


def _wall_ms() -> int:
    return int(time.time() * 1000)


class RegistrationGuard:
    """The check of one NameServer: its credential (None: it has none), whether it runs
    ``insecure``, and the nonces of the window."""

    def __init__(self, key: bytes | None, insecure: bool = False,
                 window_ms: int = WINDOW_MS_DEFAULT,
                 wall_ms: Callable[[], int] = _wall_ms,
                 canaries: frozenset[str] = frozenset()) -> None:
        unknown = canaries - NAMESRV_CANARIES
        if unknown:
            raise ValueError(f"unknown NameServer canaries {sorted(unknown)}")
        self._key = key
        self.insecure = insecure
        self._skip = "namesrv_skip_signature" in canaries
        self._nonces = NonceCache(window_ms)
        self._wall_ms = wall_ms
        self.refused = 0  # registrations and unregistrations refused by this check
        self.unsigned_accepted = 0  # accepted unsigned (``insecure`` only)

    @property
    def key(self) -> bytes | None:
        """The credential (this NameServer's own reads of a broker's /status are signed with
        it: ``--protect-status``)."""
        return self._key

    @property
    def mode(self) -> str:
        """"signed" (registrations must be signed), "insecure" or "refusing" (no credential);
        "unchecked" with the seeded bug."""
        if self._skip:
            return "unchecked"
        if self.insecure:
            return "insecure"
        return "signed" if self._key is not None else "refusing"

    def check(self, headers: Mapping[str, str], method: str, path: str, body: bytes,
              group: str, node_id: str) -> None:
        """Return if ``group/node_id`` may send this request; else raise
        ``UnsignedRequestError`` (401) or ``BadClusterSignatureError`` (403)."""
        try:
            self._check(headers, method, path, body, group, node_id)
        except (UnsignedRequestError, BadClusterSignatureError) as err:
            self.refused += 1
            log.warning("%s %s of %s/%s refused: %s", method, path, group, node_id, err)
            raise

    def _check(self, headers: Mapping[str, str], method: str, path: str, body: bytes,
               group: str, node_id: str) -> None:
        if self._skip:
            return  # the seeded bug: nothing checked
        if self._key is None:
            if self.insecure:
                self.unsigned_accepted += 1
                return
            raise UnsignedRequestError(
                "this NameServer has no cluster credential, so it accepts no registration: "
                f"start it with --cluster-key-file FILE (or ${CLUSTER_KEY_ENV}), the brokers "
                "with the same; or, knowingly, with --insecure")
        try:
            signer = verify(self._key, headers, method, path, body, self._wall_ms(),
                            self._nonces)
        except UnsignedRequestError:
            if self.insecure:
                self.unsigned_accepted += 1
                return
            raise
        if (signer.group, signer.node_id) != (group, node_id):
            raise BadClusterSignatureError(f"signed by {signer.group}/{signer.node_id} for "
                                           f"{group}/{node_id}: a node signs for itself only")
