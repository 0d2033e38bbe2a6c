"""The HTTP API of Toxiproxy 2.x on aiohttp: routing, middleware and reply shapes.

Owns the wire form of docs/toxiproxy.md: the routes and their status codes,
compact JSON success bodies, ``{"error": msg, "status": code}\\n`` error bodies served as
text/plain, Go's ``404 page not found`` for unknown paths and an empty 405 for a wrong method,
the browser User-Agent guard (403), the 25 s handler cap (503) and the request-id header. All
state changes are delegated to ``registry``; this module only translates.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from chaos.toxiproxy.decode import parse_body
from chaos.toxiproxy.errors import ApiError
from chaos.toxiproxy.registry import PopulateError, Registry, decode_proxy

VERSION = "2.12.0"
HANDLER_TIMEOUT_S = 25.0
TEXT_PLAIN = "text/plain; charset=utf-8"

Handler = Callable[[web.Request, Registry, dict[str, str]], Awaitable[web.Response]]


def json_reply(payload: Any, status: int = 200) -> web.Response:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return web.Response(status=status, body=body, headers={"Content-Type": "application/json"})


def error_reply(status: int, message: str, **extra: Any) -> web.Response:
    body = json.dumps({"error": message, "status": status, **extra}, separators=(",", ":")) + "\n"
    return web.Response(status=status, body=body.encode(),
                        headers={"Content-Type": TEXT_PLAIN, "X-Content-Type-Options": "nosniff"})


def empty_reply(status: int) -> web.Response:
    return web.Response(status=status)


def proxies_json(proxies: list[Any]) -> list[dict[str, Any]] | None:
    return [proxy.to_json() for proxy in proxies] or None  # Go marshals an empty slice as null


# --- handlers ---------------------------------------------------------------------------------

async def list_proxies(request: web.Request, registry: Registry, _: dict[str, str]) -> web.Response:
    return json_reply({name: registry.proxies[name].to_json() for name in sorted(registry.proxies)})


async def create_proxy(request: web.Request, registry: Registry, _: dict[str, str]) -> web.Response:
    proxy_request = decode_proxy(parse_body(await request.read()))
    proxy = await registry.create(proxy_request)
    return json_reply(proxy.to_json(), status=201)


async def get_proxy(request: web.Request, registry: Registry, args: dict[str, str]) -> web.Response:
    return json_reply(registry.get(args["proxy"]).to_json())


async def update_proxy(request: web.Request, registry: Registry,
                       args: dict[str, str]) -> web.Response:
    registry.get(args["proxy"])  # 404 comes before a bad body
    proxy = await registry.update(args["proxy"], parse_body(await request.read()))
    return json_reply(proxy.to_json())


async def delete_proxy(request: web.Request, registry: Registry,
                       args: dict[str, str]) -> web.Response:
    await registry.delete(args["proxy"])
    return empty_reply(204)


async def list_toxics(request: web.Request, registry: Registry,
                      args: dict[str, str]) -> web.Response:
    return json_reply(registry.get(args["proxy"]).to_json()["toxics"])


async def create_toxic(request: web.Request, registry: Registry,
                       args: dict[str, str]) -> web.Response:
    registry.get(args["proxy"])
    spec = await registry.add_toxic(args["proxy"], parse_body(await request.read()))
    return json_reply(spec.to_json())


async def get_toxic(request: web.Request, registry: Registry, args: dict[str, str]) -> web.Response:
    return json_reply(registry.get_toxic(args["proxy"], args["toxic"]).to_json())


async def update_toxic(request: web.Request, registry: Registry,
                       args: dict[str, str]) -> web.Response:
    registry.get_toxic(args["proxy"], args["toxic"])
    body = parse_body(await request.read())
    spec = await registry.update_toxic(args["proxy"], args["toxic"], body)
    return json_reply(spec.to_json())


async def delete_toxic(request: web.Request, registry: Registry,
                       args: dict[str, str]) -> web.Response:
    await registry.remove_toxic(args["proxy"], args["toxic"])
    return empty_reply(204)


async def reset(request: web.Request, registry: Registry, _: dict[str, str]) -> web.Response:
    await registry.reset()
    return empty_reply(204)


async def populate(request: web.Request, registry: Registry, _: dict[str, str]) -> web.Response:
    try:
        proxies = await registry.populate(parse_body(await request.read()))
    except PopulateError as exc:
        return error_reply(exc.status, exc.message, proxies=proxies_json(exc.proxies))
    except ApiError as exc:
        return error_reply(exc.status, exc.message, proxies=None)
    return json_reply({"proxies": proxies_json(proxies)}, status=201)


async def version(request: web.Request, registry: Registry, _: dict[str, str]) -> web.Response:
    body = json.dumps({"version": VERSION}) + "\n"
    return web.Response(body=body.encode(),
                        headers={"Content-Type": "application/json;charset=utf-8"})


_SEGMENT = "([^/]+)"
ROUTES: list[tuple[re.Pattern[str], tuple[str, ...], dict[str, Handler]]] = [
    (re.compile(r"/proxies"), (), {"GET": list_proxies, "POST": create_proxy}),
    (re.compile(rf"/proxies/{_SEGMENT}"), ("proxy",),
     {"GET": get_proxy, "POST": update_proxy, "PATCH": update_proxy, "DELETE": delete_proxy}),
    (re.compile(rf"/proxies/{_SEGMENT}/toxics"), ("proxy",),
     {"GET": list_toxics, "POST": create_toxic}),
    (re.compile(rf"/proxies/{_SEGMENT}/toxics/{_SEGMENT}"), ("proxy", "toxic"),
     {"GET": get_toxic, "POST": update_toxic, "PATCH": update_toxic, "DELETE": delete_toxic}),
    (re.compile(r"/reset"), (), {"POST": reset}),
    (re.compile(r"/populate"), (), {"POST": populate}),
    (re.compile(r"/version"), (), {"GET": version}),
]


def route(method: str, path: str) -> tuple[Handler, dict[str, str]] | web.Response:
    """The handler for a request, or the 404/405 reply gorilla/mux would give."""
    for pattern, names, handlers in ROUTES:
        match = pattern.fullmatch(path)
        if match is None:
            continue
        handler = handlers.get(method)
        if handler is None:
            return empty_reply(405)
        return handler, dict(zip(names, match.groups(), strict=True))
    return web.Response(status=404, body=b"404 page not found\n",
                        headers={"Content-Type": TEXT_PLAIN, "X-Content-Type-Options": "nosniff"})


def make_app(registry: Registry) -> web.Application:
    async def dispatch(request: web.Request) -> web.Response:
        routed = route(request.method, request.path)
        if isinstance(routed, web.Response):
            return routed
        handler, args = routed
        try:
            async with asyncio.timeout(HANDLER_TIMEOUT_S):
                async with registry.lock:
                    return await handler(request, registry, args)
        except ApiError as exc:
            return error_reply(exc.status, exc.message)
        except TimeoutError:
            return error_reply(503, "request timed out")

    @web.middleware
    async def guard(request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]) -> Any:
        if request.headers.get("User-Agent", "").startswith("Mozilla/"):
            response = web.Response(status=403, body=b"User agent not allowed\n",
                                    headers={"Content-Type": TEXT_PLAIN})
        else:
            response = await handler(request)
        response.headers["X-Toxiproxy-Request-Id"] = secrets.token_hex(10)
        return response

    app = web.Application(middlewares=[guard])
    app.router.add_route("*", "/{tail:.*}", dispatch)
    return app


__all__ = ["HANDLER_TIMEOUT_S", "VERSION", "make_app", "route"]
