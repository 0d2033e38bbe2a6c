"""Which node a peer's certificate names, and the check made on every peer connection under
``--peer-mtls`` (docs/tls.md).

The rule: a certificate names node ``node_id`` of group ``group`` by carrying the URI subject
alternative name ``dledger-node:<group>/<node_id>`` (each part percent-encoded as a URI path
segment: group ``a`` and node ``n0`` give ``dledger-node:a/n0``). A certificate may name several
nodes; the common name does not count. With ``--peer-mtls`` both ends of a peer link check it:
the acceptor, that the dialer's client certificate names the node its Hello (or SnapshotHello)
claims; the dialer, that the listener's certificate names the peer it meant to dial.

Owns the rule and its check, as pure functions of a certificate in the form ``ssl`` gives a
verified peer's (``SSLObject.getpeercert()``), plus ``refusal`` which reads that from an asyncio
transport. Must not: accept a connection whose certificate was not verified (no certificate
names no node), or read the common name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from protocol.errors import DLedgerError

__all__ = ["URI_SCHEME", "PeerIdentityError", "check_peer", "named_nodes", "node_uri", "refusal"]

URI_SCHEME = "dledger-node"


class PeerIdentityError(DLedgerError):
    """A peer's certificate does not name the node it claims to be (or there is none)."""


def node_uri(group: str, node_id: str) -> str:
    """The URI a certificate carries to name node ``node_id`` of ``group``."""
    if not group or not node_id:
        raise ValueError("a node's name needs a group and a node id")
    return f"{URI_SCHEME}:{quote(group, safe='')}/{quote(node_id, safe='')}"


def named_nodes(peercert: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The ``dledger-node:`` URIs among a certificate's subject alternative names."""
    if not peercert:
        return ()
    return tuple(value for kind, value in peercert.get("subjectAltName", ())
                 if kind == "URI" and isinstance(value, str)
                 and value.startswith(URI_SCHEME + ":"))


def _serial(peercert: Mapping[str, Any]) -> str:
    return str(peercert.get("serialNumber", "?"))


def check_peer(peercert: Mapping[str, Any] | None, group: str, node_id: str) -> None:
    """Raise PeerIdentityError unless ``peercert`` names ``node_id`` of ``group``."""
    want = node_uri(group, node_id)
    if not peercert:
        raise PeerIdentityError(f"no verified certificate: cannot be {want}")
    names = named_nodes(peercert)
    if want in names:
        return
    said = ", ".join(names) if names else "no node"
    raise PeerIdentityError(f"its certificate (serial {_serial(peercert)}) names {said}, "
                            f"not {want}")


def refusal(transport: Any, group: str, node_id: str) -> str | None:
    """Why the TLS connection ``transport`` (an asyncio transport) may not carry ``node_id``'s
    traffic, named (``PeerIdentityError: ...``); None when its peer's certificate names it."""
    try:
        check_peer(transport.get_extra_info("peercert"), group, node_id)
    except PeerIdentityError as err:
        return f"{type(err).__name__}: {err}"
    return None
