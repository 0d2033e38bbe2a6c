"""One proxy: its listening socket, its toxics, and the connections it is carrying.

Owns the lifecycle of docs/toxiproxy.md: bind ``listen`` (port 0 picks one; the bound
address is reported and reused on re-enable), accept a client, dial ``upstream`` and join the two
with a ``Connection``; stop = close the listener (new connects are refused) and abort every open
connection. Owns the proxy's toxic list (upstream and downstream, in insertion order) and applies
each change to the live connections. It does not decode requests or check names: ``registry``
does that.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import random
import socket
from typing import Any

from chaos.toxiproxy.errors import ListenError
from chaos.toxiproxy.link import Connection
from chaos.toxiproxy.toxics import DOWNSTREAM, UPSTREAM, ToxicSpec

log = logging.getLogger(__name__)

DIAL_TIMEOUT_S = 10.0
LISTEN_BACKLOG = 128


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port); an empty address means ``:0``."""
    if address == "":
        return "", 0
    host, sep, port_text = address.rpartition(":")
    if not sep:
        raise ListenError(f"address {address}: missing port in address")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ListenError(f"address {address}: too many colons in address")
    if not port_text.isdigit() or int(port_text) > 65535:
        raise ListenError(f"address {address}: invalid port")
    return host, int(port_text)


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def resolve_listen(address: str) -> tuple[int, str, int]:
    """(family, ip, port) a listen address binds to: one address, IPv4 preferred."""
    host, port = split_host_port(address)
    if host == "":
        return socket.AF_INET6, "::", port
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ListenError(f"listen tcp {address}: lookup {host}: {exc.strerror}") from exc
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    family, _, _, _, sockaddr = infos[0]
    ip = sockaddr[0]
    if not isinstance(ip, str):  # (int, bytes): a Python built with --disable-ipv6
        raise ListenError(f"listen tcp {address}: lookup {host}: no IP address")
    return family, ip, port


def _bind(family: int, ip: str, port: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and ip == "::":
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # one dual-stack socket
        sock.bind((ip, port))
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class Proxy:
    """A named proxy from ``listen`` to ``upstream``."""

    def __init__(self, name: str, listen: str, upstream: str, rng: random.Random) -> None:
        self.name = name
        self.listen = listen  # as given until first bound, then the bound address
        self.upstream = upstream
        self.enabled = False
        self.rng = rng
        self.toxics: dict[str, list[ToxicSpec]] = {UPSTREAM: [], DOWNSTREAM: []}
        self.connections: set[Connection] = set()
        self._server: asyncio.AbstractServer | None = None

    def to_json(self) -> dict[str, Any]:
        toxics = [spec.to_json() for spec in self.toxics[UPSTREAM] + self.toxics[DOWNSTREAM]]
        return {"name": self.name, "listen": self.listen, "upstream": self.upstream,
                "enabled": self.enabled, "toxics": toxics}

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind and accept. Raises ListenError (and stays disabled) if that fails."""
        if self.enabled:
            return
        family, ip, port = await resolve_listen(self.listen)
        wildcard = ip == "::"
        try:
            sock = _bind(family, ip, port)
        except OSError as exc:
            if not (wildcard and exc.errno == errno.EAFNOSUPPORT):
                raise self._listen_error(exc) from exc
            sock = self._bind_or_raise(socket.AF_INET, "0.0.0.0", port)  # no IPv6 here
        self._server = await asyncio.start_server(self._on_accept, sock=sock)
        bound_ip, bound_port = sock.getsockname()[:2]
        # Go reports a wildcard listener as [::]:port whichever family it really got.
        self.listen = join_host_port("::" if wildcard else bound_ip, bound_port)
        self.enabled = True

    def _bind_or_raise(self, family: int, ip: str, port: int) -> socket.socket:
        try:
            return _bind(family, ip, port)
        except OSError as exc:
            raise self._listen_error(exc) from exc

    def _listen_error(self, exc: OSError) -> ListenError:
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        return ListenError(f"listen tcp {self.listen}: bind: {reason}")

    async def stop(self) -> None:
        """Close the listener and drop every connection abruptly. Toxics stay configured."""
        self.enabled = False
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for connection in list(self.connections):
            connection.abort()
        self.connections.clear()

    async def _on_accept(self, client_reader: asyncio.StreamReader,
                         client_writer: asyncio.StreamWriter) -> None:
        try:
            host, port = split_host_port(self.upstream)
            async with asyncio.timeout(DIAL_TIMEOUT_S):
                upstream = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError, ListenError) as exc:
            log.info("proxy %s: dial %s failed: %s", self.name, self.upstream, exc)
            client_writer.close()
            return
        if not self.enabled:  # stopped while dialling
            client_writer.transport.abort()
            upstream[1].transport.abort()
            return
        toxics = {direction: list(specs) for direction, specs in self.toxics.items()}
        connection = Connection((client_reader, client_writer), upstream, toxics, self.rng,
                                self.connections.discard)
        self.connections.add(connection)
        connection.start()

    # --- toxics -------------------------------------------------------------------------------

    def find_toxic(self, name: str) -> ToxicSpec | None:
        for spec in self.toxics[UPSTREAM] + self.toxics[DOWNSTREAM]:
            if spec.name == name:
                return spec
        return None

    def add_toxic(self, spec: ToxicSpec) -> None:
        self.toxics[spec.direction].append(spec)
        for connection in list(self.connections):
            connection.add_toxic(spec)

    async def update_toxic(self, spec: ToxicSpec) -> None:
        specs = self.toxics[spec.direction]
        specs[[s.name for s in specs].index(spec.name)] = spec
        for connection in list(self.connections):
            await connection.update_toxic(spec)

    async def remove_toxic(self, name: str) -> None:
        spec = self.find_toxic(name)
        assert spec is not None, name
        self.toxics[spec.direction].remove(spec)
        for connection in list(self.connections):
            await connection.remove_toxic(spec)

    async def remove_all_toxics(self) -> None:
        for spec in self.toxics[UPSTREAM] + self.toxics[DOWNSTREAM]:
            await self.remove_toxic(spec.name)


__all__ = ["DIAL_TIMEOUT_S", "Proxy", "join_host_port", "resolve_listen", "split_host_port"]
