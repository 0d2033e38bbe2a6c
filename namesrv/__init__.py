"""The NameServer: a stateless routing table of broker groups, fed by broker registrations and
queried by clients over HTTP. ``registry`` holds the pure rules (leadership fencing by term,
leases), ``model`` the validated registration record, ``server`` the aiohttp API and the
embeddable ``NameServer``; ``python -m namesrv`` runs one. The server's names load on first use:
importing the package must not load asyncio and aiohttp before the entry point has decided
whether the process loads OpenSSL (``namesrv.__main__``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from namesrv.errors import BadRequestError, NameSrvError, RegistryFullError, ServerStateError
from namesrv.model import Registration, TopicRoute, parse_host_port, parse_registration
from namesrv.registry import GroupView, NodeView, RegisterOutcome, Registry, TopicGroupRoute

if TYPE_CHECKING:
    from namesrv.server import BODY_BYTES_MAX, NameServer, make_app

__all__ = [
    "BODY_BYTES_MAX", "BadRequestError", "GroupView", "NameServer", "NameSrvError", "NodeView",
    "RegisterOutcome", "Registration", "Registry", "RegistryFullError", "ServerStateError",
    "TopicGroupRoute", "TopicRoute", "make_app", "parse_host_port", "parse_registration",
]

_FROM_SERVER = ("BODY_BYTES_MAX", "NameServer", "make_app")


def __getattr__(name: str) -> Any:
    if name in _FROM_SERVER:
        from namesrv import server

        return getattr(server, name)
    raise AttributeError(f"module 'namesrv' has no attribute {name!r}")
