"""The set of proxies and every operation the API performs on it, with Toxiproxy's checks.

Owns name uniqueness, the order in which a request is checked (docs/toxiproxy.md: body,
required fields, conflicts, then binding), proxy updates (restart on a changed listen or
upstream, compared after resolving), ``populate`` and ``reset``. Every failure is a named
``ApiError``; turning results into HTTP replies is ``api``'s job. Operations are serialised by
one lock, as Go's server serialises them with a mutex.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any

from chaos.toxiproxy import toxics
from chaos.toxiproxy.decode import get_bool, get_str, require_array, require_object
from chaos.toxiproxy.errors import ApiError, BadRequestError, ConflictError, NotFoundError
from chaos.toxiproxy.proxy import Proxy, resolve_listen
from chaos.toxiproxy.toxics import ToxicSpec


@dataclasses.dataclass(frozen=True)
class ProxyRequest:
    """A decoded proxy definition of ``POST /proxies`` or ``/populate``."""

    name: str
    upstream: str
    listen: str
    enabled: bool


class PopulateError(ApiError):
    """``/populate`` stopped at an entry; ``proxies`` are the ones processed before it."""

    def __init__(self, cause: ApiError, proxies: list[Proxy]) -> None:
        super().__init__(cause.message, cause.status)
        self.proxies = proxies


def decode_proxy(body: Any, where: str = "") -> ProxyRequest:
    obj = require_object(body, "proxy")
    request = ProxyRequest(name=get_str(obj, "name", ""), upstream=get_str(obj, "upstream", ""),
                           listen=get_str(obj, "listen", ""),
                           enabled=get_bool(obj, "enabled", True))
    for field in ("name", "upstream"):
        if not getattr(request, field):
            raise BadRequestError(f"missing required field: {field}{where}")
    return request


async def same_listen(a: str, b: str) -> bool:
    return await resolve_listen(a) == await resolve_listen(b)


class Registry:
    """All proxies of one server, by name."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.proxies: dict[str, Proxy] = {}
        self.lock = asyncio.Lock()

    def get(self, name: str) -> Proxy:
        proxy = self.proxies.get(name)
        if proxy is None:
            raise NotFoundError("proxy not found")
        return proxy

    def get_toxic(self, proxy_name: str, toxic_name: str) -> ToxicSpec:
        spec = self.get(proxy_name).find_toxic(toxic_name)
        if spec is None:
            raise NotFoundError("toxic not found")
        return spec

    async def create(self, request: ProxyRequest) -> Proxy:
        if request.name in self.proxies:
            raise ConflictError("proxy already exists")
        proxy = Proxy(request.name, request.listen, request.upstream, self.rng)
        if request.enabled:
            await proxy.start()  # a bind failure leaves nothing behind
        self.proxies[proxy.name] = proxy
        return proxy

    async def update(self, name: str, body: Any) -> Proxy:
        proxy = self.get(name)
        obj = require_object(body, "proxy")
        listen = get_str(obj, "listen", proxy.listen)
        upstream = get_str(obj, "upstream", proxy.upstream)
        enabled = get_bool(obj, "enabled", proxy.enabled)
        moved = upstream != proxy.upstream or not await same_listen(listen, proxy.listen)
        if moved:
            await proxy.stop()
            proxy.listen, proxy.upstream = listen, upstream
        if enabled:
            await proxy.start()
        else:
            await proxy.stop()
        return proxy

    async def delete(self, name: str) -> None:
        proxy = self.get(name)
        await proxy.stop()
        del self.proxies[name]

    async def add_toxic(self, proxy_name: str, body: Any) -> ToxicSpec:
        proxy = self.get(proxy_name)
        request = toxics.decode_create(body)
        if proxy.find_toxic(request.name) is not None:
            raise ConflictError("toxic already exists")
        spec = toxics.build(request)
        proxy.add_toxic(spec)
        return spec

    async def update_toxic(self, proxy_name: str, toxic_name: str, body: Any) -> ToxicSpec:
        current = self.get_toxic(proxy_name, toxic_name)
        spec = toxics.decode_update(body, current)
        await self.get(proxy_name).update_toxic(spec)
        return spec

    async def remove_toxic(self, proxy_name: str, toxic_name: str) -> None:
        self.get_toxic(proxy_name, toxic_name)
        await self.get(proxy_name).remove_toxic(toxic_name)

    async def reset(self) -> None:
        """Enable every proxy and remove every toxic (a bind failure stops the reset)."""
        for name in sorted(self.proxies):
            proxy = self.proxies[name]
            await proxy.start()
            await proxy.remove_all_toxics()

    async def populate(self, body: Any) -> list[Proxy]:
        entries = require_array(body, "proxies")
        requests = [decode_proxy(entry, f" at proxy {index}")
                    for index, entry in enumerate(entries, start=1)]
        done: list[Proxy] = []
        for request in requests:
            try:
                done.append(await self._populate_one(request))
            except ApiError as exc:
                raise PopulateError(exc, done) from exc
        return done

    async def _populate_one(self, request: ProxyRequest) -> Proxy:
        existing = self.proxies.get(request.name)
        if existing is not None:
            if existing.upstream == request.upstream and \
                    await same_listen(existing.listen, request.listen):
                return existing  # untouched: enabled state, toxics and connections survive
            await existing.stop()
            del self.proxies[request.name]
        return await self.create(request)

    async def close(self) -> None:
        for proxy in list(self.proxies.values()):
            await proxy.stop()
        self.proxies.clear()


__all__ = ["PopulateError", "ProxyRequest", "Registry", "decode_proxy", "same_listen"]
