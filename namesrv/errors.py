"""The NameServer's named errors, one branch per way a caller can get it wrong.

Owns the exception hierarchy only; the HTTP layer (``server``) maps each class to a status code.
"""

from __future__ import annotations

__all__ = ["BadRequestError", "ConsoleConflictError", "ConsoleNotFoundError",
           "ConsoleReadOnlyError", "NameSrvError", "RegistrationMismatchError", "RegistryFullError",
           "ServerStateError", "TermNotCorroboratedError"]


class NameSrvError(Exception):
    """Base of every error the NameServer raises on purpose."""


class BadRequestError(NameSrvError):
    """Input from the network is malformed: a missing field, a wrong type, a bad address (400)."""


class RegistrationMismatchError(NameSrvError):
    """An unregister names a term or instance other than the node's registration's (409)."""


class TermNotCorroboratedError(NameSrvError):
    """A registration's term jumps past what the group's nodes report, and none of them (nor
    the node itself) confirmed it when asked (409)."""


class RegistryFullError(NameSrvError):
    """A bound on groups or nodes per group would be exceeded by a new registration (503)."""


class ServerStateError(NameSrvError):
    """``start``/``stop``/``address`` called in the wrong state of the embeddable server."""


class ConsoleReadOnlyError(NameSrvError):
    """An action of the web console asked of a NameServer started with ``--console-read-only``
    (403)."""


class ConsoleNotFoundError(NameSrvError):
    """An action or view of the web console names a broker group, node, topic or message the
    cluster does not have (404)."""


class ConsoleConflictError(NameSrvError):
    """An action of the web console the cluster's state refuses as it is now, e.g. an offset
    reset while live members consume the topic (409)."""
