"""A Toxiproxy-compatible fault proxy server (asyncio) and a checked client wrapper.

The chaos suite drives network faults through the Toxiproxy 2.x HTTP API (docs/toxiproxy.md); no
Toxiproxy binary is installable here, so this package implements the server: ``ToxiproxyServer``
(embedded, asyncio), ``ServerThread`` (for synchronous code) and ``python -m chaos.toxiproxy``
(standalone). ``client.ToxiproxyClient`` wraps toxiproxy-python and honours ``TOXIPROXY_URL`` to run
the same tests against a real Toxiproxy.
"""

from chaos.toxiproxy.errors import (
                                    ApiError,
                                    BadRequestError,
                                    ConflictError,
                                    ListenError,
                                    NotFoundError,
                                    ToxiproxyError,
)
from chaos.toxiproxy.server import ServerStateError, ServerThread, ToxiproxyServer
from chaos.toxiproxy.toxics import TOXIC_TYPES, ToxicSpec

__all__ = [
                                    "TOXIC_TYPES",
                                    "ApiError",
                                    "BadRequestError",
                                    "ConflictError",
                                    "ListenError",
                                    "NotFoundError",
                                    "ServerStateError",
                                    "ServerThread",
                                    "ToxicSpec",
                                    "ToxiproxyError",
                                    "ToxiproxyServer",
]
