"""The NameServer's HTTP API (aiohttp) and the embeddable server that runs it with its lease scan.

Owns routes, JSON request/response shapes, the mapping of named errors to status codes (every
error, unknown paths and oversized bodies included, is a JSON body ``{"error": ...}``) and the
periodic expiry scan. It does not decide routing: that is the pure ``registry.Registry``, which
this module only feeds with the clock's time, and with the group's answer when a registration's
term must be corroborated (``corroborate``). Every response carries the header
``X-NameServer-Boot-Id``, drawn at start: a broker that sees it change re-registers at once.

Endpoints:
  POST /v1/brokers/register      a node's registration (refreshes its lease); this and the
                                 unregister must be signed (``registration_auth``): 401 / 403
  POST /v1/brokers/unregister    {"group", "node_id", "term"[, "instance"]}: the registration named
  GET  /v1/topics/{topic}/route  groups serving the topic, their nodes, leader and queues
  GET  /v1/topics                sorted topic names
  GET  /v1/cluster               every group with nodes, leader and topics
  GET  /livez, /readyz
  GET  /metrics                  Prometheus text (``namesrv.metrics``)
  GET  /console ...                the operators' web console (``console``; off with console=False)

The same port serves RocketMQ 4.x clients in the remoting protocol (``namesrv.remoting``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from namesrv.console import add_console
from namesrv.corroborate import Corroborator
from namesrv.errors import (
    BadRequestError,
    RegistrationMismatchError,
    RegistryFullError,
    ServerStateError,
    TermNotCorroboratedError,
)
from namesrv.listener import Sniffer
from namesrv.metrics import NameServerMetrics, metrics_middleware
from namesrv.model import (
    Registration,
    parse_registration,
    parse_topic_name,
    parse_unregistration,
)
from namesrv.registration_auth import RegistrationGuard
from namesrv.registry import LEASE_S_DEFAULT, RegisterOutcome, Registry
from namesrv.remoting import RemotingNameServer
from protocol.cluster_key import BadClusterSignatureError, UnsignedRequestError
from protocol.framed import ConnectionLimits
from protocol.tls import TlsConfig

if TYPE_CHECKING:
    import ssl

__all__ = ["BODY_BYTES_MAX", "BOOT_ID_HEADER", "NameServer", "make_app"]

log = logging.getLogger(__name__)

BODY_BYTES_MAX = 1024 * 1024
SCAN_INTERVAL_S_DEFAULT = 5.0
STOP_TIMEOUT_S = 5.0
BOOT_ID_HEADER = "X-NameServer-Boot-Id"
Clock = Callable[[], float]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_REGISTRY_KEY = web.AppKey("registry", Registry)
_CLOCK_KEY = web.AppKey[Clock]("clock")  # a callable is no class: the type goes in the subscript
_CORROBORATOR_KEY = web.AppKey("corroborator", Corroborator)
_BOOT_ID_KEY = web.AppKey("boot_id", str)
_METRICS_KEY = web.AppKey("metrics", NameServerMetrics)
_GUARD_KEY = web.AppKey("guard", RegistrationGuard)


def make_app(registry: Registry, clock: Clock = time.monotonic, *, console: bool = True,
             console_read_only: bool = False, dial_ssl: ssl.SSLContext | None = None,
             tls_ca: str | None = None,
             guard: RegistrationGuard | None = None) -> web.Application:
    """The aiohttp application serving ``registry``; ``clock`` gives ``now_s`` for every call.
    With ``console``, the web console too (its actions refused with ``console_read_only``);
    ``dial_ssl``: how to reach the brokers' admin endpoints over TLS (None: plain HTTP);
    ``guard``: who may register (``registration_auth``; None: nobody)."""
    metrics = NameServerMetrics(registry, clock)
    app = web.Application(middlewares=[metrics_middleware(metrics), _boot_id, _json_errors],
                          client_max_size=BODY_BYTES_MAX)
    app[_REGISTRY_KEY] = registry
    app[_METRICS_KEY] = metrics
    app[_CLOCK_KEY] = clock
    guard = guard if guard is not None else RegistrationGuard(None)
    app[_CORROBORATOR_KEY] = Corroborator(ssl_context=dial_ssl, status_key=guard.key)
    app[_BOOT_ID_KEY] = uuid.uuid4().hex
    app[_GUARD_KEY] = guard
    app.on_cleanup.append(_close_corroborator)
    app.router.add_post("/v1/brokers/register", _register)
    app.router.add_post("/v1/brokers/unregister", _unregister)
    app.router.add_get("/v1/topics/{topic}/route", _route)
    app.router.add_get("/v1/topics", _topics)
    app.router.add_get("/v1/cluster", _cluster)
    app.router.add_get("/livez", _livez)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", metrics.handle)
    if console:
        def cluster_view() -> list[dict[str, Any]]:
            now_s = clock()
            _expire(registry, now_s)
            return [g.to_json() for g in registry.cluster(now_s)]
        add_console(app, cluster_view, clock, read_only=console_read_only, dial_ssl=dial_ssl,
                    tls_ca=tls_ca, status_key=guard.key)
    return app


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


async def _close_corroborator(app: web.Application) -> None:
    await app[_CORROBORATOR_KEY].close()


@web.middleware
async def _boot_id(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    response.headers[BOOT_ID_HEADER] = request.app[_BOOT_ID_KEY]
    return response


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as JSON: named errors by class, aiohttp's own (404, 405, 413) too."""
    try:
        return await handler(request)
    except BadRequestError as exc:
        return _error(400, str(exc))
    except UnsignedRequestError as exc:
        return _error(401, str(exc))
    except BadClusterSignatureError as exc:
        return _error(403, str(exc))
    except (TermNotCorroboratedError, RegistrationMismatchError) as exc:
        return _error(409, str(exc))
    except RegistryFullError as exc:
        return _error(503, str(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        extra: dict[str, Any] = {"path": request.path} if exc.status == 404 else {}
        if exc.status == 413:
            extra["body_bytes_max"] = BODY_BYTES_MAX
        return _error(exc.status, exc.reason.lower(), **extra)


async def _json_body(request: web.Request) -> object:
    raw = await request.read()  # bounded by client_max_size: 413 beyond it
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequestError(f"the body is not valid JSON: {exc}") from exc
    except RecursionError as exc:  # deep nesting within the size bound: the decoder's own limit
        raise BadRequestError("the body is not valid JSON: nested too deeply") from exc


def _now_s(request: web.Request) -> float:
    return request.app[_CLOCK_KEY]()


def _expire(registry: Registry, now_s: float, metrics: NameServerMetrics | None = None) -> None:
    for group, node_id in registry.expire(now_s):
        log.info("lease expired: group %s node %s (not refreshed within %g s)", group, node_id,
                 registry.lease_s, extra={"group": group, "node": node_id})
        if metrics is not None:
            metrics.expired.inc()


def _fresh(request: web.Request) -> tuple[Registry, float]:
    """The registry with leases already past dropped, so a read never routes to a registration
    that expired since the last scan (the scan still bounds memory when nobody reads)."""
    registry, now_s = request.app[_REGISTRY_KEY], _now_s(request)
    _expire(registry, now_s, request.app[_METRICS_KEY])
    return registry, now_s


async def _signed_body(request: web.Request) -> object:
    """The body of a registration or an unregistration whose signature checks for the node it
    names (``registration_auth``): 401 or 403 before anything changes."""
    raw = await request.read()
    body = await _json_body(request)
    names = body if isinstance(body, dict) else {}
    request.app[_GUARD_KEY].check(request.headers, request.method, request.path, raw,
                                  str(names.get("group", "")), str(names.get("node_id", "")))
    return body


async def _register(request: web.Request) -> web.Response:
    reg = parse_registration(await _signed_body(request))
    registry, now_s = _fresh(request)
    known_term = registry.term_to_verify(reg, now_s)
    if known_term is not None:  # a jump past the group's terms: the group must confirm it
        await request.app[_CORROBORATOR_KEY].check(
            reg, known_term, registry.admin_addresses(reg.group, now_s))
        registry, now_s = _fresh(request)  # time passed while we asked
    routed = registry.leader_of(reg.group)
    outcome = registry.register(reg, now_s)
    _log_registration(reg, outcome, routed)
    metrics = request.app[_METRICS_KEY]
    metrics.registrations.inc()
    if outcome.stale:
        metrics.stale_claims.inc()
        log.warning("stale leader claim refused: group %s node %s term %d (leader %s at term %d)",
                    reg.group, reg.node_id, reg.term, outcome.leader, outcome.term)
    return web.json_response(outcome.to_json())


def _log_registration(reg: Registration, outcome: RegisterOutcome,
                      routed: tuple[str | None, int] | None) -> None:
    """INFO lines of a node's first registration and of a change of its group's routed leader
    (a refresh that changes nothing writes none)."""
    if outcome.first:
        log.info("registered: group %s node %s (%s at term %d; client %s, admin %s)", reg.group,
                 reg.node_id, reg.role, reg.term, reg.client_address, reg.admin_address,
                 extra={"group": reg.group, "node": reg.node_id})
    if outcome.leader is not None and routed != (outcome.leader, outcome.term):
        was = f"{routed[0]} at term {routed[1]}" if routed is not None and routed[0] else "none"
        log.info("group %s: leader is %s at term %d (was %s)", reg.group, outcome.leader,
                 outcome.term, was, extra={"group": reg.group, "leader": outcome.leader})


async def _unregister(request: web.Request) -> web.Response:
    named = parse_unregistration(await _signed_body(request))
    registry, now_s = _fresh(request)
    removed = registry.unregister(named, now_s)
    if removed:
        log.info("unregistered: group %s node %s (it stopped, at term %d)", named.group,
                 named.node_id, named.term, extra={"group": named.group, "node": named.node_id})
    return web.json_response({"ok": True, "removed": removed})


async def _route(request: web.Request) -> web.Response:
    topic = parse_topic_name(request.match_info["topic"])
    registry, now_s = _fresh(request)
    routes = registry.route(topic, now_s)
    if not routes:
        return _error(404, "topic not found", topic=topic)
    return web.json_response({"topic": topic, "groups": [r.to_json() for r in routes]})


async def _topics(request: web.Request) -> web.Response:
    registry, _ = _fresh(request)
    return web.json_response({"topics": registry.topics()})


async def _cluster(request: web.Request) -> web.Response:
    registry, now_s = _fresh(request)
    groups = registry.cluster(now_s)
    return web.json_response({"groups": [g.to_json() for g in groups]})


async def _livez(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _readyz(request: web.Request) -> web.Response:
    # Stateless: ready as soon as it serves; the group count is for operators.
    registry, _ = _fresh(request)
    return web.json_response({"ready": True, "groups": registry.live_group_count(),
                              "registrations": request.app[_GUARD_KEY].mode})


class NameServer:
    """The API on ``host:port`` plus a task expiring leases every ``scan_interval_s``.

    ``await start()`` binds (port 0 allowed) and returns the bound (host, port); ``await stop()``
    closes the listener and the scan, each bounded by ``STOP_TIMEOUT_S``. ``clock`` is injectable
    so tests can move time without waiting. The web console is served at ``/console``; with
    ``console_read_only`` its actions are refused. Registrations must be signed with
    ``cluster_key``; with none, all are refused, unless ``insecure`` (unsigned ones pass).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 9876,
                 lease_s: float = LEASE_S_DEFAULT, scan_interval_s: float = SCAN_INTERVAL_S_DEFAULT,
                 clock: Clock = time.monotonic, console_read_only: bool = False,
                 tls: TlsConfig | None = None, cluster_key: bytes | None = None,
                 insecure: bool = False, canaries: frozenset[str] = frozenset()) -> None:
        if scan_interval_s <= 0:
            raise ValueError("scan_interval_s must be positive")
        self.host = host
        self.port = port
        self.scan_interval_s = scan_interval_s
        self.registry = Registry(lease_s)
        self._clock = clock
        self.console_read_only = console_read_only
        self.tls = tls  # serve https; reach the brokers' admin endpoints over TLS (protocol.tls)
        # who may register: nodes signing with cluster_key (none: nobody, unless insecure)
        self.guard = RegistrationGuard(cluster_key, insecure, canaries=canaries)  # (tests' bugs)
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._remoting_limits = ConnectionLimits()  # the 4.x clients' connections
        self._scan_task: asyncio.Task[None] | None = None
        self._address: tuple[str, int] | None = None
        self._metrics: NameServerMetrics | None = None

    @property
    def address(self) -> tuple[str, int]:
        if self._address is None:
            raise ServerStateError("name server not started")
        return self._address

    @property
    def url(self) -> str:
        host, port = self.address
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"

    async def start(self) -> tuple[str, int]:
        """Bind the API and start the expiry scan; return the bound (host, port)."""
        if self._runner is not None:
            raise ServerStateError("name server already started")
        tls = self.tls
        app = make_app(self.registry, self._clock, console_read_only=self.console_read_only,
                       dial_ssl=tls.dial_context() if tls else None,
                       tls_ca=tls.ca_file if tls else None, guard=self.guard)
        self._metrics = app[_METRICS_KEY]
        runner = web.AppRunner(app, access_log=None,
                               handle_signals=False, shutdown_timeout=STOP_TIMEOUT_S)
        await runner.setup()
        http = runner.server
        assert http is not None
        limits = self._remoting_limits = ConnectionLimits()
        try:  # one port for HTTP and RocketMQ's remoting protocol (namesrv.listener)
            self._server = await asyncio.get_running_loop().create_server(
                lambda: Sniffer(http, lambda: RemotingNameServer(self.registry, self._clock,
                                                                 limits)),
                self.host, self.port, ssl=tls.server_context() if tls else None)
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        bound = self._server.sockets[0].getsockname()
        self._address = (bound[0], bound[1])
        self._scan_task = asyncio.create_task(self._scan_forever(), name="namesrv-lease-scan")
        if self.guard.mode == "insecure":
            log.warning("--insecure: registrations without the cluster credential's signature "
                        "are accepted: anyone who reaches %s:%d can change the routes",
                        *self._address)
        elif self.guard.mode == "unchecked":
            log.warning("the seeded bug namesrv_skip_signature is on (tests only): no "
                        "registration's signature is checked")
        elif self.guard.mode == "refusing":
            log.warning("no cluster credential (--cluster-key-file or $DLEDGER_CLUSTER_KEY): "
                        "every registration is refused")
        return self._address

    async def stop(self) -> None:
        """Stop the scan and close the API; safe to call twice."""
        task, self._scan_task = self._scan_task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task], timeout=STOP_TIMEOUT_S)
        server, self._server = self._server, None
        if server is not None:
            server.close()
            for conn in list(self._remoting_limits.open):
                if conn.transport is not None:
                    conn.transport.abort()
        runner, self._runner = self._runner, None
        if runner is not None:
            await asyncio.wait_for(runner.cleanup(), timeout=2 * STOP_TIMEOUT_S)
        self._address = None

    async def _scan_forever(self) -> None:
        while True:  # ends when stop() cancels it
            await asyncio.sleep(self.scan_interval_s)
            _expire(self.registry, self._clock(), self._metrics)
