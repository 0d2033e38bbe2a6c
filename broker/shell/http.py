"""A broker node's admin HTTP endpoints (served by ``broker.shell.http_server``): ``/status``
(JSON), ``/metrics`` (Prometheus text, ``broker.shell.metrics``), ``/livez`` and ``/readyz``.
Read-only views of the node and its state machine. With ``--protect-status``, ``/status`` (the
topology, every group's offsets) answers only a read signed with the cluster credential
(``protocol.cluster_key``: the NameServer's console and term checks, ``dledger status`` with the
credential in its environment): 401 unsigned, 403 a signature that fails (both in a rate-limited
log line: ``STATUS_REFUSALS``); the health probes and ``/metrics`` (Prometheus cannot sign) stay
open."""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from broker.shell.http_server import Handler, Request, Response, json_response
from broker.shell.metrics import CONTENT_TYPE_LATEST
from dledger.node.runtime import Node
from protocol.cluster_key import (
    BadClusterSignatureError,
    NonceCache,
    UnsignedRequestError,
    verify,
)
from protocol.log_summary import EventSummary

STATUS_REFUSALS = EventSummary(logging.getLogger("broker.admin"),
                               "refused /status reads (--protect-status)")


class Rendered(Protocol):
    def render(self) -> bytes: ...


class HttpHost(Protocol):
    """What the admin endpoints read of a broker node (``broker.server.BrokerServer``)."""

    @property
    def node(self) -> Node: ...

    @property
    def metrics(self) -> Rendered: ...

    def status(self) -> dict[str, Any]: ...

    def caught_up(self) -> bool: ...


def make_routes(server: HttpHost, status_key: bytes | None = None) -> dict[str, Handler]:
    """The endpoints by path; ``status_key``: ``/status`` answers only reads signed with it."""
    nonces = NonceCache()

    async def status(request: Request) -> Response:
        if status_key is not None:
            try:
                verify(status_key, request.headers, "GET", request.path, b"",
                       int(time.time() * 1000), nonces)
            except UnsignedRequestError as err:
                STATUS_REFUSALS.note("unsigned", request.remote, err)
                return json_response({"error": str(err)}, 401)
            except BadClusterSignatureError as err:
                STATUS_REFUSALS.note("bad signature", request.remote, err)
                return json_response({"error": str(err)}, 403)
        return json_response(server.status())

    async def livez(_: Request) -> Response:
        # A node whose log stopped (a failed write or fsync) is not alive as a member: 503, so
        # that a probe looking only at the status code (a supervisor, Kubernetes) restarts it.
        failure = server.node.failure
        if failure is None:
            return json_response({"ok": True})
        return json_response({"ok": False, "failure": f"{type(failure).__name__}: {failure}"},
                             503)

    async def readyz(_: Request) -> Response:
        ready = server.caught_up()
        return json_response({"ready": ready, "leader": server.node.status().raft.leader_id},
                             200 if ready else 503)

    async def metrics(_: Request) -> Response:
        return Response(200, server.metrics.render(), CONTENT_TYPE_LATEST)

    return {"/status": status, "/livez": livez, "/readyz": readyz, "/metrics": metrics}
