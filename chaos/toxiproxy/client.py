"""A thin, checked wrapper around toxiproxy-python for the chaos suite.

Owns the fixes for the client's gaps listed in docs/toxiproxy.md: every call has a timeout,
every non-2xx status raises (400/404/409 keep toxiproxy-python's ``InvalidToxic``/``NotFound``/
``ProxyExists``; any other failure, e.g. a 500 bind error, raises ``ToxiproxyApiError``), proxies
are addressed by name, toxics can be updated, ``populate`` uses the server's ``/populate``, and
the server URL comes from ``TOXIPROXY_URL`` when set (so the suite can run against a real
Toxiproxy). It returns toxiproxy-python's ``Proxy`` and ``Toxic`` objects. It must not start
servers.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import requests
from toxiproxy import Proxy, Toxiproxy
from toxiproxy.api import APIConsumer, validate_response
from toxiproxy.toxic import Toxic

from chaos.toxiproxy.errors import ToxiproxyError

ENV_URL = "TOXIPROXY_URL"
DEFAULT_URL = "http://127.0.0.1:8474"
REQUEST_TIMEOUT_S = 10.0


class ToxiproxyApiError(ToxiproxyError):
    """The server answered with a status toxiproxy-python would have let through."""

    def __init__(self, method: str, path: str, status: int, body: bytes) -> None:
        try:
            message = json.loads(body).get("error", "")
        except (ValueError, AttributeError):
            message = body.decode(errors="replace").strip()
        super().__init__(f"{method} {path}: {status} {message}")
        self.status = status
        self.body = body
        self.message = message


def resolve_url(url: str | None = None) -> str:
    """``url``, else ``$TOXIPROXY_URL``, else the default local API address."""
    return url or os.environ.get(ENV_URL) or DEFAULT_URL


def listen_address(proxy: Proxy) -> tuple[str, int]:
    """(host, port) a client should connect to for this proxy (a wildcard means loopback)."""
    host, _, port = proxy.listen.rpartition(":")
    host = host.strip("[]")
    if host in ("", "::", "0.0.0.0"):
        host = "127.0.0.1"
    return host, int(port)


class ToxiproxyClient:
    """Talks to one Toxiproxy API. toxiproxy-python keeps host/port in class attributes, so each
    call re-points it at this client's server first."""

    def __init__(self, url: str | None = None, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.url = resolve_url(url).rstrip("/")
        parts = urlsplit(self.url)
        if parts.hostname is None or parts.port is None:
            raise ToxiproxyError(f"toxiproxy URL needs a host and a port: {self.url!r}")
        self.host, self.port = parts.hostname, parts.port
        self.timeout_s = timeout_s
        self.toxiproxy = Toxiproxy()

    def _activate(self) -> None:
        self.toxiproxy.update_api_consumer(self.host, self.port)

    def _request(self, method: str, path: str, body: Any = None) -> requests.Response:
        self._activate()
        response: requests.Response
        if method == "GET":
            response = APIConsumer.get(path, timeout=self.timeout_s)
        elif method == "POST":
            response = APIConsumer.post(path, json=body, timeout=self.timeout_s)
        elif method == "DELETE":
            response = APIConsumer.delete(path, timeout=self.timeout_s)
        else:
            response = validate_response(requests.request(
                method, f"http://{self.host}:{self.port}{path}", json=body,
                timeout=self.timeout_s))
        if not response.ok:
            raise ToxiproxyApiError(method, path, response.status_code, response.content)
        return response

    # --- server --------------------------------------------------------------------------------

    def version(self) -> str:
        text = self._request("GET", "/version").text.strip()
        try:
            version: str = json.loads(text)["version"]  # {"version": "2.x.y", ...}
            return version
        except (ValueError, KeyError, TypeError):
            return text  # Toxiproxy <= 2.5 answers plain text

    def reset(self) -> None:
        self._request("POST", "/reset")

    def populate(self, definitions: list[dict[str, Any]]) -> list[Proxy]:
        reply = self._request("POST", "/populate", definitions).json()
        return [Proxy(**proxy) for proxy in reply.get("proxies") or []]

    # --- proxies -------------------------------------------------------------------------------

    def proxies(self) -> dict[str, Proxy]:
        return {name: Proxy(**values)
                for name, values in self._request("GET", "/proxies").json().items()}

    def get_proxy(self, name: str) -> Proxy:
        return Proxy(**self._request("GET", f"/proxies/{name}").json())

    def create_proxy(self, name: str, upstream: str, listen: str = "127.0.0.1:0",
                     enabled: bool = True) -> Proxy:
        body = {"name": name, "upstream": upstream, "listen": listen, "enabled": enabled}
        return Proxy(**self._request("POST", "/proxies", body).json())

    def update_proxy(self, name: str, **fields: Any) -> Proxy:
        """Change any of ``listen``, ``upstream``, ``enabled`` (POST: works on every 2.x)."""
        return Proxy(**self._request("POST", f"/proxies/{name}", fields).json())

    def disable(self, name: str) -> Proxy:
        return self.update_proxy(name, enabled=False)

    def enable(self, name: str) -> Proxy:
        return self.update_proxy(name, enabled=True)

    @contextlib.contextmanager
    def down(self, name: str) -> Iterator[None]:
        """The proxy is disabled inside the block and enabled again after it."""
        self.disable(name)
        try:
            yield
        finally:
            self.enable(name)

    def delete_proxy(self, name: str) -> None:
        self._request("DELETE", f"/proxies/{name}")

    def destroy_all(self) -> None:
        for name in self.proxies():
            self.delete_proxy(name)

    # --- toxics --------------------------------------------------------------------------------

    def toxics(self, proxy: str) -> dict[str, Toxic]:
        listed = self._request("GET", f"/proxies/{proxy}/toxics").json()
        return {toxic["name"]: Toxic(proxy=proxy, **toxic) for toxic in listed}

    def add_toxic(self, proxy: str, type: str, stream: str = "downstream",
                  name: str | None = None, toxicity: float = 1.0,
                  attributes: dict[str, int] | None = None) -> Toxic:
        body = {"name": name or f"{type}_{stream}", "type": type, "stream": stream,
                "toxicity": toxicity, "attributes": attributes or {}}
        toxic = self._request("POST", f"/proxies/{proxy}/toxics", body).json()
        return Toxic(proxy=proxy, **toxic)

    def update_toxic(self, proxy: str, name: str, attributes: dict[str, int] | None = None,
                     toxicity: float | None = None) -> Toxic:
        """Merge ``attributes`` into the toxic's and/or replace its toxicity (PATCH, >= 2.6)."""
        body: dict[str, Any] = {}
        if attributes is not None:
            body["attributes"] = attributes
        if toxicity is not None:
            body["toxicity"] = toxicity
        toxic = self._request("PATCH", f"/proxies/{proxy}/toxics/{name}", body).json()
        return Toxic(proxy=proxy, **toxic)

    def remove_toxic(self, proxy: str, name: str) -> None:
        self._request("DELETE", f"/proxies/{proxy}/toxics/{name}")


__all__ = ["DEFAULT_URL", "ENV_URL", "ToxiproxyApiError", "ToxiproxyClient", "listen_address",
           "resolve_url"]
