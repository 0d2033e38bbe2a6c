"""The NameServer: a stateless routing table of broker groups, fed by broker registrations and
queried by clients over HTTP. ``registry`` holds the pure rules (leadership fencing by term,
leases), ``model`` the validated registration record, ``server`` the aiohttp API and the
embeddable ``NameServer``; ``python -m namesrv`` runs one."""

from namesrv.errors import BadRequestError, NameSrvError, RegistryFullError, ServerStateError
from namesrv.model import Registration, TopicRoute, parse_host_port, parse_registration
from namesrv.registry import GroupView, NodeView, RegisterOutcome, Registry, TopicGroupRoute
from namesrv.server import BODY_BYTES_MAX, NameServer, make_app

__all__ = [
    "BODY_BYTES_MAX", "BadRequestError", "GroupView", "NameServer", "NameSrvError", "NodeView",
    "RegisterOutcome", "Registration", "Registry", "RegistryFullError", "ServerStateError",
    "TopicGroupRoute", "TopicRoute", "make_app", "parse_host_port", "parse_registration",
]
