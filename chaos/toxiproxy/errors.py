"""Named errors of the Toxiproxy-compatible server.

Owns the mapping from a failed operation to the HTTP status and message that Toxiproxy 2.x
returns for it (docs/toxiproxy.md). Raised by the registry and the request decoders;
turned into an HTTP reply only by ``api``. Must not know anything about HTTP framing.
"""

from __future__ import annotations


class ToxiproxyError(Exception):
    """Base of every error this package raises on purpose."""


class ApiError(ToxiproxyError):
    """An operation failed in a way the HTTP API reports with ``status`` and ``message``."""

    status = 500

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class BadRequestError(ApiError):
    """The request body could not be decoded or a field has the wrong type or value (400)."""

    status = 400


class NotFoundError(ApiError):
    """The named proxy or toxic does not exist (404)."""

    status = 404


class ConflictError(ApiError):
    """A proxy or toxic with that name already exists (409)."""

    status = 409


class ListenError(ApiError):
    """The listen address could not be resolved or bound (500, the proxy stays stopped)."""

    status = 500


__all__ = ["ApiError", "BadRequestError", "ConflictError", "ListenError", "NotFoundError",
           "ToxiproxyError"]
