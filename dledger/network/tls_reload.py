"""Certificate rotation: what a server with TLS does on SIGHUP (``TlsReloader.reload``, hooked up
by the process entry points of the nodes and the NameServer). It reads its ``--tls-cert``,
``--tls-key`` and ``--tls-ca`` files again and uses them for every new connection, on its
listeners and when it dials (``protocol.tls.TlsConfig.reload``); connections already open keep
theirs, and the Raft node goes on as it was.

New files are refused, and the ones in use stay, when they cannot be read, the key does not fit
the certificate, the certificate is not valid now (expired, or not yet valid), or, on a node
with ``--peer-mtls``, it does not name this node (its peers would refuse it:
``dledger.network.peer_identity``). Each outcome is logged with the certificate's subject,
serial and expiry, and a refusal by its error's name; never any key material.

Owns the checks of a new certificate and the log lines; the contexts are ``protocol.tls``'s.
Must not: raise out of the signal handler, or change the contexts when a check failed.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass

from cryptography import x509

from dledger.network.peer_identity import URI_SCHEME, PeerIdentityError, node_uri
from protocol.tls import TlsConfig, TlsConfigError

__all__ = ["CertificateInfo", "TlsReloader", "read_certificate"]

log = logging.getLogger("dledger.tls")


@dataclass(frozen=True)
class CertificateInfo:
    """What the logs say of a certificate (no key material)."""

    subject: str
    serial: str  # upper-case hex of whole bytes, as ``ssl``'s getpeercert() shows it
    not_before: datetime.datetime
    not_after: datetime.datetime
    nodes: tuple[str, ...]  # the nodes it names (``dledger-node:`` URIs)

    def __str__(self) -> str:
        named = f", names {' '.join(self.nodes)}" if self.nodes else ""
        return (f"subject {self.subject!r}, serial {self.serial}, "
                f"expires {self.not_after:%Y-%m-%d %H:%M:%S} UTC{named}")


def read_certificate(path: str) -> CertificateInfo:
    """The first certificate of the PEM file ``path`` (the leaf of a chain); TlsConfigError when
    it cannot be read or is no certificate."""
    try:
        with open(path, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
    except (OSError, ValueError) as err:
        raise TlsConfigError(f"cannot read the certificate {path!r}: {err}") from err
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = sans.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    serial = format(cert.serial_number, "X")
    serial = "0" * (len(serial) % 2) + serial  # whole bytes, as OpenSSL (and ssl) print it
    return CertificateInfo(cert.subject.rfc4514_string(), serial,
                           cert.not_valid_before_utc, cert.not_valid_after_utc,
                           tuple(u for u in uris if u.startswith(URI_SCHEME + ":")))


def check_new(info: CertificateInfo, now: datetime.datetime,
              node: tuple[str, str] | None) -> None:
    """Refuse a certificate not valid at ``now``, or (``node``: a node with --peer-mtls, its
    group and id) one that does not name that node."""
    if now >= info.not_after:
        raise TlsConfigError(f"the certificate expired at {info.not_after:%Y-%m-%d %H:%M:%S} UTC")
    if now < info.not_before:
        raise TlsConfigError(f"the certificate is not valid before "
                             f"{info.not_before:%Y-%m-%d %H:%M:%S} UTC")
    if node is not None and node_uri(*node) not in info.nodes:
        said = " ".join(info.nodes) or "no node"
        raise PeerIdentityError(f"the certificate names {said}, not this node "
                                f"{node_uri(*node)}: its peers would refuse it")


class TlsReloader:
    """``reload()`` on SIGHUP (see the module docstring). ``node``: this node's group and id,
    checked against a new certificate when the config has ``peer_mtls``."""

    def __init__(self, tls: TlsConfig, node: tuple[str, str] | None = None) -> None:
        self.tls = tls
        self._node = node if tls.peer_mtls else None
        self.reloads = 0
        self.refusals = 0
        try:
            self.current: CertificateInfo | None = read_certificate(tls.cert_file)
        except TlsConfigError:  # (ssl read it: only a file changed since would fail here)
            self.current = None
        if self.current is not None and self._node is not None \
                and node_uri(*self._node) not in self.current.nodes:
            log.warning("--peer-mtls: this node's certificate (%s) does not name it as %s: "
                        "its peers will refuse its connections (docs/tls.md)", self.current,
                        node_uri(*self._node))

    def reload(self, now: datetime.datetime | None = None) -> bool:
        """Read the files again; True when new connections use them from now on."""
        try:
            info = read_certificate(self.tls.cert_file)
            check_new(info, now or datetime.datetime.now(datetime.UTC), self._node)
            self.tls.reload()
        except (TlsConfigError, PeerIdentityError) as err:
            self.refusals += 1
            log.error("TLS reload refused, %s: %s; still serving %s", type(err).__name__, err,
                      self.current or "the certificate read before")
            return False
        self.reloads += 1
        self.current = info
        # WARNING, not INFO: the servers log warnings and up by default, and a rotation is an
        # event an operator wants to see confirmed.
        log.warning("TLS reloaded from %s: new connections present %s (open ones keep theirs)",
                    self.tls.cert_file, info)
        return True
