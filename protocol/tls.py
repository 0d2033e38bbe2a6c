"""TLS settings of every listener and every dialer: the ``--tls-cert/--tls-key/--tls-ca`` files
(``TlsConfig``, checked when made), the ``ssl.SSLContext`` each side builds from them, and the one
rule by which a dialer decides to speak TLS (``dial_context``).

A cluster is all-TLS or all-plain (docs/tls.md). A server with a ``TlsConfig`` serves TLS 1.2 or
later on its client, peer, admin HTTP and gRPC listeners (the NameServer on its HTTP API); a
dialer speaks TLS when it is given a CA file (``tls_ca=``, ``--tls-ca`` or ``DLEDGER_TLS_CA``) or a
NameServer address written ``https://host:port``, and then verifies the server's certificate and
host name. Peer links are mutual TLS with ``peer_mtls``: both ends present their node certificate
and each requires the other's to be signed by the CA.

Owns only the settings and the contexts; listeners and dialers pass them to asyncio, aiohttp and
grpc. Must not: fall back to plain TCP when TLS fails, or turn verification off.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass

__all__ = ["ENV_CA", "HTTPS_PREFIX", "TlsConfig", "TlsConfigError", "client_context",
           "dial_context", "split_https", "tls_failure"]

ENV_CA = "DLEDGER_TLS_CA"  # a client's CA file when its caller gives none
HTTPS_PREFIX = "https://"


class TlsConfigError(ValueError):
    """TLS files that are missing, unreadable or do not fit together (the message says which)."""


def _minimum(ctx: ssl.SSLContext) -> ssl.SSLContext:
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def _load_chain(ctx: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as err:
        raise TlsConfigError(f"cannot load the certificate {cert_file!r} with the key "
                             f"{key_file!r}: {err}") from err


def client_context(ca_file: str | None, cert_file: str | None = None,
                   key_file: str | None = None) -> ssl.SSLContext:
    """A dialer's context: verify the server's certificate against ``ca_file`` (None: the
    system's trust store) and its host name; present ``cert_file`` when given (mutual TLS)."""
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    except (OSError, ssl.SSLError) as err:
        raise TlsConfigError(f"cannot load the CA file {ca_file!r}: {err}") from err
    if cert_file is not None and key_file is not None:
        _load_chain(ctx, cert_file, key_file)
    return _minimum(ctx)


@dataclass(frozen=True)
class TlsConfig:
    """A server's TLS files. ``peer_mtls``: peer links require a certificate signed by
    ``ca_file`` from the dialing node, and present this node's certificate when dialing."""

    cert_file: str
    key_file: str
    ca_file: str
    peer_mtls: bool = False

    def __post_init__(self) -> None:
        for what, path in (("--tls-cert", self.cert_file), ("--tls-key", self.key_file),
                           ("--tls-ca", self.ca_file)):
            if not os.path.isfile(path):
                raise TlsConfigError(f"{what} {path!r} is not a readable file")

    @classmethod
    def from_options(cls, cert_file: str | None, key_file: str | None, ca_file: str | None,
                     peer_mtls: bool = False) -> TlsConfig | None:
        """The command line's TLS options: all three files or none (None: plain TCP)."""
        given = [f for f in (cert_file, key_file, ca_file) if f]
        if not given:
            if peer_mtls:
                raise TlsConfigError("--peer-mtls needs --tls-cert, --tls-key and --tls-ca")
            return None
        if len(given) != 3:
            raise TlsConfigError("TLS needs all of --tls-cert, --tls-key and --tls-ca")
        assert cert_file and key_file and ca_file
        config = cls(cert_file, key_file, ca_file, peer_mtls)
        config.server_context()  # a key that does not match its certificate fails here
        return config

    def server_context(self, require_client_cert: bool = False) -> ssl.SSLContext:
        """A listener's context; with ``require_client_cert`` a client must present a
        certificate signed by the CA."""
        ctx = _minimum(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))
        _load_chain(ctx, self.cert_file, self.key_file)
        if require_client_cert:
            try:
                ctx.load_verify_locations(cafile=self.ca_file)
            except (OSError, ssl.SSLError) as err:
                raise TlsConfigError(f"cannot load the CA file {self.ca_file!r}: {err}") from err
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def peer_server_context(self) -> ssl.SSLContext:
        return self.server_context(require_client_cert=self.peer_mtls)

    def peer_client_context(self) -> ssl.SSLContext:
        """Dialing a peer: verify it against the CA; present our certificate with mTLS."""
        if self.peer_mtls:
            return client_context(self.ca_file, self.cert_file, self.key_file)
        return client_context(self.ca_file)

    def dial_context(self) -> ssl.SSLContext:
        """Dialing another service of the cluster (a NameServer, a broker's admin or client
        port): verified against the CA, no client certificate."""
        return client_context(self.ca_file)


def split_https(addresses: list[str]) -> tuple[list[str], bool]:
    """NameServer addresses with any ``https://`` prefix removed, and whether one had it."""
    https = any(a.strip().lower().startswith(HTTPS_PREFIX) for a in addresses)
    out = []
    for a in addresses:
        for part in a.replace(";", ",").split(","):
            part = part.strip()
            out.append(part[len(HTTPS_PREFIX):] if part.lower().startswith(HTTPS_PREFIX) else part)
    return [a for a in out if a], https


def dial_context(ca_file: str | None, https: bool = False,
                 from_env: bool = True) -> ssl.SSLContext | None:
    """The one rule for a dialer: TLS when a CA file is given (else ``DLEDGER_TLS_CA``, unless
    not ``from_env``), or when ``https`` (an ``https://`` address) asks for it with no CA (the
    system's trust store); None: plain TCP."""
    ca = ca_file or (os.environ.get(ENV_CA) if from_env else None) or None
    if ca is None and not https:
        return None
    return client_context(ca)


def tls_failure(err: BaseException) -> str | None:
    """Why ``err`` is a TLS failure (a certificate not verified, a handshake refused), or None
    when it is something else (a refused or reset connection, a timeout)."""
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:  # aiohttp wraps the ssl error
        seen.add(id(cur))
        # (aiohttp's errors subclass these without their attributes: read them with getattr)
        if isinstance(cur, ssl.SSLCertVerificationError) and getattr(cur, "verify_message", None):
            return f"certificate not trusted: {cur.verify_message}"
        if isinstance(cur, ssl.SSLError) and getattr(cur, "reason", None):
            return f"TLS handshake failed: {cur.reason}"
        cur = cur.__cause__ or cur.__context__
    return None
