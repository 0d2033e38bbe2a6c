"""The operators' web console at ``/console``, served by the NameServer's aiohttp app: a static
page (``console_static/``: HTML, CSS and vanilla JS, no build step, nothing loaded from outside
the cluster) and the JSON and event-stream endpoints it reads.

  GET  /console                              the page
  GET  /console/static/{file}                its script, style and icon (also at /favicon.ico)
  GET  /console/events                       server-sent events: one ``snapshot`` per poll
  GET  /console/api/config                   {"read_only": ...}
  GET  /console/api/snapshot                 the cluster now (``console_poll``)
  GET  /console/api/topics[?topic=T]         queues, min/max offsets, rates
  GET  /console/api/consumer-groups[/{g}]    names; one group's members, lag, retries, DLQ
  GET  /console/api/messages?...             search (``console_model.parse_search``)
  GET  /console/api/messages/{offset_msg_id} one message
  POST /console/api/topics                   create or update a topic
  POST /console/api/leader-transfer          hand a group's leadership to a node
  POST /console/api/reset-offset             set a consumer group's offsets on a topic
  POST /console/api/consume-directly         one consumer consumes one stored message again

Owns the routes, the mapping of errors to status codes (every failure is JSON ``{"error": ...,
"error_type": ...}``), the bound on action bodies, read-only mode (``--console-read-only``: every
action refused (403), the page hides them) and a viewer's sign-in: with access control on, an
action goes to the cluster signed by the account the page sends (headers
``X-Dledger-Access-Key``, ``X-Dledger-Secret-Key``; use the console over TLS), else by the
NameServer's own account (``DLEDGER_ACCESS_KEY``): give the NameServer a read-only account and
viewers who have not signed in as an admin can only look (403 AccessDeniedError).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from client import errors as client_errors
from namesrv.console_model import (
    parse_consume_directly,
    parse_reset,
    parse_search,
    parse_topic_action,
    parse_transfer,
)
from namesrv.console_ops import OP_TIMEOUT_S, Clock, ClusterView, ConsoleOps
from namesrv.console_poll import ClusterPoller, ConsoleBusyError
from namesrv.errors import (
    BadRequestError,
    ConsoleConflictError,
    ConsoleNotFoundError,
    ConsoleReadOnlyError,
    NameSrvError,
)
from protocol.auth import Credentials

if TYPE_CHECKING:
    import ssl

__all__ = ["ACTION_BODY_BYTES_MAX", "BodyTooLargeError", "Console", "add_console", "console_of"]

STATIC_DIR = Path(__file__).resolve().parent / "console_static"
ACTION_BODY_BYTES_MAX = 16 << 10
ACCESS_KEY_HEADER = "X-Dledger-Access-Key"  # a signed-in viewer's account, sent with actions
SECRET_KEY_HEADER = "X-Dledger-Secret-Key"
KEEPALIVE_S = 10.0  # an idle event stream gets a comment this often (proxies close silent ones)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BodyTooLargeError(NameSrvError):
    """An action's body is larger than ``ACTION_BODY_BYTES_MAX`` (413)."""


@dataclass
class Console:
    poller: ClusterPoller
    ops: ConsoleOps
    read_only: bool
    page: str


_CONSOLE_KEY = web.AppKey("console", Console)


async def _favicon(_: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "favicon.svg", headers={"Content-Type": "image/svg+xml"})


def add_console(app: web.Application, cluster_view: ClusterView, clock: Clock,
                read_only: bool = False, dial_ssl: ssl.SSLContext | None = None,
                tls_ca: str | None = None, status_key: bytes | None = None) -> Console:
    """Serve the console on ``app``; ``cluster_view`` gives the registry's ``/v1/cluster``
    groups (leases already expired); ``status_key`` signs its reads of the brokers' /status."""
    page = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    console = Console(ClusterPoller(cluster_view, ssl_context=dial_ssl, status_key=status_key),
                      ConsoleOps(cluster_view, clock, tls_ca), read_only,
                      page.replace("__READ_ONLY__", "true" if read_only else "false"))
    app[_CONSOLE_KEY] = console
    app.on_shutdown.append(_stop_feeds)  # before the runner waits for the open event streams
    app.on_cleanup.append(_close_clients)
    r = app.router
    r.add_get("/console", _page)
    r.add_get("/console/", _page)
    r.add_static("/console/static", STATIC_DIR)
    r.add_get("/favicon.ico", _favicon)  # (what a browser asks for by itself)
    r.add_get("/console/events", _events)
    r.add_get("/console/api/config", _api(_config))
    r.add_get("/console/api/snapshot", _api(_snapshot))
    r.add_get("/console/api/topics", _api(_topics))
    r.add_get("/console/api/consumer-groups", _api(_consumer_groups))
    r.add_get("/console/api/consumer-groups/{group}", _api(_consumer_group))
    r.add_get("/console/api/messages", _api(_messages))
    r.add_get("/console/api/messages/{msg_id}", _api(_message))
    r.add_post("/console/api/topics", _api(_put_topic))
    r.add_post("/console/api/leader-transfer", _api(_transfer))
    r.add_post("/console/api/reset-offset", _api(_reset))
    r.add_post("/console/api/consume-directly", _api(_consume_directly))
    return console


def console_of(app: web.Application) -> Console:
    """The console ``add_console`` put on ``app`` (``KeyError`` if none)."""
    return app[_CONSOLE_KEY]


async def _stop_feeds(app: web.Application) -> None:
    await app[_CONSOLE_KEY].poller.close()


async def _close_clients(app: web.Application) -> None:
    await app[_CONSOLE_KEY].ops.close()


def _error(status: int, err: BaseException | str) -> web.Response:
    text = err if isinstance(err, str) else str(err) or type(err).__name__
    kind = "" if isinstance(err, str) else type(err).__name__
    return web.json_response({"error": text, "error_type": kind}, status=status)


_STATUS: tuple[tuple[type[BaseException], int], ...] = (
    (BadRequestError, 400),
    (ConsoleReadOnlyError, 403),
    (client_errors.AccessDeniedError, 403),  # access control: the account may not
    (client_errors.SignatureError, 403),
    (BodyTooLargeError, 413),
    (ConsoleNotFoundError, 404),
    (client_errors.MessageNotFoundError, 404),
    (client_errors.TopicNotFoundError, 404),
    (ConsoleConflictError, 409),
    (client_errors.ConsumerGroupActiveError, 409),
    (client_errors.ClientNotConnectedError, 404),  # no such consumer to ask
    (ConsoleBusyError, 503),
    (client_errors.NonRetriableError, 422),  # the cluster refused the request as it is
    (client_errors.RetriableError, 503),  # no leader, unavailable: try again
    (client_errors.ClientError, 502),
)


def _api(handler: Handler) -> Handler:
    """Named errors of the console and of the client library as JSON with their status."""
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except TimeoutError:
            return _error(504, f"the cluster did not answer within {OP_TIMEOUT_S:g} s")
        except tuple(cls for cls, _ in _STATUS) as err:
            status = next(code for cls, code in _STATUS if isinstance(err, cls))
            return _error(status, err)
    return wrapped


def _console(request: web.Request) -> Console:
    return request.app[_CONSOLE_KEY]


def _ops(request: web.Request) -> ConsoleOps:
    """The console's client of the cluster, pointed at the address this request arrived on
    (an address of this very NameServer)."""
    ops = _console(request).ops
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    if sock is not None:
        host, port = sock[0], sock[1]
        ops.bind(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    else:
        ops.bind(request.host)
    return ops


async def _page(request: web.Request) -> web.Response:
    return web.Response(text=_console(request).page, content_type="text/html",
                        headers={"Cache-Control": "no-store"})


async def _events(request: web.Request) -> web.StreamResponse:
    try:
        async with _console(request).poller.subscribe() as sub:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-store"})
            await resp.prepare(request)
            try:
                await resp.write(b"retry: 1000\n\n")  # the browser reconnects after a second
                while not sub.closed:  # until the browser leaves or the server stops
                    data = await sub.next(KEEPALIVE_S)
                    if sub.closed:
                        break
                    await resp.write(b": keepalive\n\n" if data is None
                                     else b"event: snapshot\ndata: " + data + b"\n\n")
            except ConnectionResetError:
                pass  # the browser left: the subscription ends with the block
            return resp
    except ConsoleBusyError as err:  # only from subscribe(), before the stream began
        return _error(503, err)


async def _config(request: web.Request) -> web.Response:
    console = _console(request)
    return web.json_response({"read_only": console.read_only,
                              "poll_interval_ms": int(console.poller.interval_s * 1000)})


async def _snapshot(request: web.Request) -> web.Response:
    return web.json_response(await _console(request).poller.snapshot())


async def _topics(request: web.Request) -> web.Response:
    only = request.query.get("topic") or None
    return web.json_response(await _ops(request).topics(only))


async def _consumer_groups(request: web.Request) -> web.Response:
    poller = _console(request).poller
    snap = poller.latest if poller.running and poller.latest else await poller.snapshot()
    names = _ops(request).consumer_group_names(snap.get("consumer_groups", []))
    return web.json_response({"consumer_groups": names})


async def _consumer_group(request: web.Request) -> web.Response:
    group = request.match_info["group"]
    parse_reset({"consumer_group": group, "topic": "x", "to": "latest"})  # the name's rules
    return web.json_response(await _ops(request).consumer_group(group))


async def _messages(request: web.Request) -> web.Response:
    search = parse_search(request.query)
    return web.json_response({"search": search.by,
                              "messages": await _ops(request).search(search)})


async def _message(request: web.Request) -> web.Response:
    search = parse_search({"msg_id": request.match_info["msg_id"]})
    return web.json_response(await _ops(request).view(search.msg_id))


async def _action_body(request: web.Request) -> object:
    """The JSON body of an action: refused in read-only mode, bounded, JSON only (a form a
    foreign page posts cannot be JSON without the browser asking this server first)."""
    if _console(request).read_only:
        raise ConsoleReadOnlyError("the console is read-only (the NameServer runs with "
                                   "--console-read-only)")
    if request.content_type != "application/json":
        raise BadRequestError(f"the body must be application/json, not {request.content_type!r}")
    too_large = BodyTooLargeError(f"an action's body is at most {ACTION_BODY_BYTES_MAX} bytes")
    if (request.content_length or 0) > ACTION_BODY_BYTES_MAX:
        raise too_large
    raw = await request.content.read(ACTION_BODY_BYTES_MAX + 1)
    if len(raw) > ACTION_BODY_BYTES_MAX:
        raise too_large
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BadRequestError(f"the body is not valid JSON: {exc}") from exc


def _viewer(request: web.Request) -> Credentials | None:
    """The credentials a signed-in viewer's page sends with an action (headers
    X-Dledger-Access-Key and X-Dledger-Secret-Key), or None: the console's own account acts."""
    key = request.headers.get(ACCESS_KEY_HEADER)
    secret = request.headers.get(SECRET_KEY_HEADER)
    if not key and not secret:
        return None
    try:
        return Credentials(key or "", secret or "")
    except ValueError as err:
        raise BadRequestError(f"the sign-in is malformed: {err}") from err


async def _put_topic(request: web.Request) -> web.Response:
    action = parse_topic_action(await _action_body(request))
    done = await _ops(request).put_topic(action, _viewer(request))
    return web.json_response({"ok": True, "topic": action.name, "mode": action.mode,
                              "groups": done})


async def _transfer(request: web.Request) -> web.Response:
    action = parse_transfer(await _action_body(request))
    return web.json_response({"ok": True, **await _ops(request).transfer(action,
                                                                          _viewer(request))})


async def _reset(request: web.Request) -> web.Response:
    action = parse_reset(await _action_body(request))
    rows = await _ops(request).reset(action, _viewer(request))
    return web.json_response({"ok": True, "consumer_group": action.consumer_group,
                              "topic": action.topic, "queues": rows})


async def _consume_directly(request: web.Request) -> web.Response:
    action = parse_consume_directly(await _action_body(request))
    result = await _ops(request).consume_directly(action, _viewer(request))
    return web.json_response({"ok": True, "consumer_group": action.consumer_group,
                              "client_id": action.client_id,
                              "offset_msg_id": action.offset_msg_id, "result": result})
