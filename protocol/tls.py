"""TLS settings of every listener and every dialer: the ``--tls-cert/--tls-key/--tls-ca`` files
(``TlsConfig``, checked when made), the ``ssl.SSLContext`` each side builds from them (and builds
again on ``TlsConfig.reload()``, which a server's SIGHUP calls), and the one rule by which a
dialer decides to speak TLS (``dial_context``).

A cluster is all-TLS or all-plain (docs/tls.md). A server with a ``TlsConfig`` serves TLS 1.2 or
later on its client, peer, admin HTTP and gRPC listeners (the NameServer on its HTTP API); a
dialer speaks TLS when it is given a CA file (``tls_ca=``, ``--tls-ca`` or ``DLEDGER_TLS_CA``) or a
NameServer address written ``https://host:port``, and then verifies the server's certificate and
host name. Peer links are mutual TLS with ``peer_mtls``: both ends present their node certificate
and each requires the other's to be signed by the CA (which node a certificate names is
``dledger.network.peer_identity``'s).

Owns only the settings and the contexts; listeners and dialers pass them to asyncio, aiohttp and
grpc. Must not: fall back to plain TCP when TLS fails, turn verification off, or let a reload
that failed change the contexts in use.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

try:
    import ssl
except ImportError:  # a server started without TLS (dledger.openssl): no context is made here
    ssl = None  # type: ignore[assignment]

__all__ = ["ENV_CA", "HTTPS_PREFIX", "SSLError", "TlsConfig", "TlsConfigError", "client_context",
           "dial_context", "split_https", "tls_failure"]

ENV_CA = "DLEDGER_TLS_CA"  # a client's CA file when its caller gives none
HTTPS_PREFIX = "https://"


class TlsConfigError(ValueError):
    """TLS files that are missing, unreadable or do not fit together (the message says which)."""


class _NoTlsError(OSError):
    """Never raised: ``SSLError`` in a process without ``ssl``, where no TLS runs."""


# What the callers catch as a TLS failure; importing it never needs ``ssl``.
SSLError: type[OSError] = _NoTlsError if ssl is None else ssl.SSLError


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


class _Contexts:
    """The contexts made from one reading of a server's files (``_build``)."""

    __slots__ = ("server", "peer_server", "peer_client")

    def __init__(self, server: ssl.SSLContext, peer_server: ssl.SSLContext,
                 peer_client: ssl.SSLContext) -> None:
        self.server = server  # the client, admin and NameServer listeners: no client certificate
        self.peer_server = peer_server  # the peer listener: a client certificate with peer_mtls
        self.peer_client = peer_client  # dialing a peer: our certificate with peer_mtls


def _server_context(cert_file: str, key_file: str, ca_file: str,
                    require_client_cert: bool) -> ssl.SSLContext:
    ctx = _minimum(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))
    _load_chain(ctx, cert_file, key_file)
    if require_client_cert:
        try:
            ctx.load_verify_locations(cafile=ca_file)
        except (OSError, ssl.SSLError) as err:
            raise TlsConfigError(f"cannot load the CA file {ca_file!r}: {err}") from err
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _front(first: ssl.SSLContext, pick: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """``first``, made the context a listener is given once: its SNI callback (which OpenSSL
    calls in every handshake, with or without a server name) moves the connection to the
    context ``pick`` returns then. The move takes that context's certificate, key and CA store;
    the verify mode stays the listener's (``_build`` never changes it for a given config)."""

    def choose(conn: ssl.SSLObject | ssl.SSLSocket, _name: str | None,
               _ctx: ssl.SSLContext) -> None:
        now = pick()
        if now is not first:
            conn.context = now
        # (returning None continues the handshake)

    first.sni_callback = choose
    return first


@dataclass(frozen=True)
class TlsConfig:
    """A server's TLS files, and the contexts made from them. ``peer_mtls``: peer links require
    a certificate signed by ``ca_file`` from the dialing node, and present this node's
    certificate when dialing.

    The contexts follow ``reload()`` (SIGHUP: ``dledger.network.tls_reload``): a listener's
    context, given to asyncio or aiohttp once, moves every new handshake to the latest
    certificate, key and CA; ``peer_client_context()`` returns the latest (a dialer asks for it
    at each connection); the one ``dial_context()`` context, which callers keep, has the CAs of
    each new reading added to what it trusts (an SSL context cannot forget a CA: one removed
    from the file stays trusted by it until the process restarts). Connections already open
    keep the certificate they were made with."""

    cert_file: str
    key_file: str
    ca_file: str
    peer_mtls: bool = False
    _live: list[_Contexts] = field(init=False, repr=False, compare=False)
    _fronts: tuple[ssl.SSLContext, ssl.SSLContext, ssl.SSLContext] = field(
        init=False, repr=False, compare=False)  # server, peer server, dial
    _reloads: list[int] = field(init=False, repr=False, compare=False)  # one cell: the count

    def __post_init__(self) -> None:
        for what, path in (("--tls-cert", self.cert_file), ("--tls-key", self.key_file),
                           ("--tls-ca", self.ca_file)):
            if not os.path.isfile(path):
                raise TlsConfigError(f"{what} {path!r} is not a readable file")
        live = [self._build()]  # one cell, swapped by reload(): the SNI callbacks read it
        fronts = (_front(live[0].server, lambda: live[0].server),
                  _front(live[0].peer_server, lambda: live[0].peer_server),
                  client_context(self.ca_file))
        object.__setattr__(self, "_live", live)
        object.__setattr__(self, "_fronts", fronts)
        object.__setattr__(self, "_reloads", [0])

    @classmethod
    def from_options(cls, cert_file: str | None, key_file: str | None, ca_file: str | None,
                     peer_mtls: bool = False) -> TlsConfig | None:
        """The command line's TLS options: all three files or none (None: plain TCP). A key
        that does not match its certificate fails here (TlsConfigError)."""
        given = [f for f in (cert_file, key_file, ca_file) if f]
        if not given:
            if peer_mtls:
                raise TlsConfigError("--peer-mtls needs --tls-cert, --tls-key and --tls-ca")
            return None
        if len(given) != 3:
            raise TlsConfigError("TLS needs all of --tls-cert, --tls-key and --tls-ca")
        assert cert_file and key_file and ca_file
        return cls(cert_file, key_file, ca_file, peer_mtls)

    def _build(self) -> _Contexts:
        """Read the three files into new contexts (TlsConfigError: unreadable, or a key that
        does not match its certificate)."""
        files = (self.cert_file, self.key_file, self.ca_file)
        peer_client = (client_context(self.ca_file, self.cert_file, self.key_file)
                       if self.peer_mtls else client_context(self.ca_file))
        return _Contexts(_server_context(*files, require_client_cert=False),
                         _server_context(*files, require_client_cert=self.peer_mtls),
                         peer_client)

    def reload(self) -> None:
        """Read the files again and use them for every new connection (see the class). A file
        that cannot be read, or a key that does not fit, raises TlsConfigError and changes
        nothing: the contexts in use stay."""
        fresh = self._build()
        try:
            self._fronts[2].load_verify_locations(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as err:
            raise TlsConfigError(f"cannot load the CA file {self.ca_file!r}: {err}") from err
        self._live[0] = fresh
        self._reloads[0] += 1

    @property
    def reloads(self) -> int:
        """How many times ``reload()`` took new files (a listener that holds the files' bytes,
        gRPC's, reads them again when this changes)."""
        return self._reloads[0]

    def server_context(self) -> ssl.SSLContext:
        """A listener's context (clients bring no certificate); follows ``reload()``."""
        return self._fronts[0]

    def peer_server_context(self) -> ssl.SSLContext:
        """The peer listener's: with ``peer_mtls`` a dialing peer must present a certificate
        signed by the CA. Follows ``reload()``."""
        return self._fronts[1]

    def peer_client_context(self) -> ssl.SSLContext:
        """Dialing a peer: verify it against the CA; present our certificate with mTLS. The
        latest reading's: ask again for each connection."""
        return self._live[0].peer_client

    def dial_context(self) -> ssl.SSLContext:
        """Dialing another service of the cluster (a NameServer, a broker's admin or client
        port): verified against the CA, no client certificate. The same context every time;
        ``reload()`` adds the CA file's certificates to what it trusts."""
        return self._fronts[2]


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
    if ssl is None:  # (no TLS in this process)
        return None
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
