"""NameServer address lists as users write them (RocketMQ's ``namesrvAddr``): the one parser
behind the broker's ``--namesrv``, the client library's ``namesrv`` argument and every
``dledger`` command's ``--namesrv``.

Addresses are separated by ``;`` (RocketMQ's spelling) or ``,``; each is ``host:port`` or a bare
``host`` that gets the NameServer's default port 9876 (so ``localhost`` means ``localhost:9876``,
not HTTP's port 80); an IPv6 host is written in brackets, ``[::1]:9876``. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Iterable

NAMESRV_PORT_DEFAULT = 9876


class NameSrvAddressError(ValueError):
    """A NameServer address list that cannot be parsed (the message names the bad entry)."""


def parse_namesrv_list(spec: str | Iterable[str]) -> tuple[str, ...]:
    """``"a:9876;b"`` (or a sequence of such strings) -> ``("a:9876", "b:9876")``: stripped,
    empty entries skipped, duplicates dropped (order kept). An empty list is an error."""
    parts = [spec] if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            raise NameSrvAddressError(f"a NameServer address must be a string, not {part!r}")
        for entry in part.replace(";", ",").split(","):
            entry = entry.strip()
            if entry:
                addr = _one(entry)
                if addr not in out:
                    out.append(addr)
    if not out:
        raise NameSrvAddressError("no NameServer address given")
    return tuple(out)


def _one(entry: str) -> str:
    if "/" in entry or any(c.isspace() for c in entry):
        raise NameSrvAddressError(f"NameServer address {entry!r} is not host or host:port")
    if entry.startswith("["):  # [v6] or [v6]:port
        host, close, rest = entry[1:].partition("]")
        if not close or not host or (rest and not rest.startswith(":")):
            raise NameSrvAddressError(f"NameServer address {entry!r}: write IPv6 as [::1]:9876")
        host, port_text = f"[{host}]", rest[1:] if rest else str(NAMESRV_PORT_DEFAULT)
    elif entry.count(":") > 1:
        raise NameSrvAddressError(f"NameServer address {entry!r}: write IPv6 in brackets, "
                                  f"[::1]:9876")
    else:
        host, _, port_text = entry.partition(":")
        if not host:
            raise NameSrvAddressError(f"NameServer address {entry!r} has no host")
        if ":" not in entry:
            port_text = str(NAMESRV_PORT_DEFAULT)
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise NameSrvAddressError(f"NameServer address {entry!r}: the port must be 1..65535")
    return f"{host}:{int(port_text)}"
