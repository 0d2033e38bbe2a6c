"""The embeddable server: the API listener plus the registry, in a loop or on its own thread.

Owns start and stop of a whole Toxiproxy-compatible server: ``ToxiproxyServer`` for asyncio code
(``await start()`` returns the bound API address, port 0 allowed; ``await stop()`` closes the API
and every proxy), and ``ServerThread`` for synchronous test code (a private event loop on a
daemon thread, every wait bounded). Loading a ``-config`` file (the ``/populate`` format) at start
lives here too. It does not implement routes or the data plane.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import random
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

from chaos.toxiproxy.api import make_app
from chaos.toxiproxy.errors import ToxiproxyError
from chaos.toxiproxy.proxy import join_host_port
from chaos.toxiproxy.registry import Registry

THREAD_START_TIMEOUT_S = 10.0
THREAD_STOP_TIMEOUT_S = 10.0


class ServerStateError(ToxiproxyError):
    """start/stop called in the wrong state (e.g. ``address`` before ``start``)."""


class ToxiproxyServer:
    """A Toxiproxy-compatible HTTP API on ``host:port`` with its proxies, in the running loop."""

    def __init__(self, host: str = "127.0.0.1", port: int = 8474, seed: int | None = None,
                 config_path: str | None = None) -> None:
        self.host = host
        self.port = port
        self.registry = Registry(random.Random(seed))
        self._config_path = config_path
        self._runner: web.AppRunner | None = None
        self._address: tuple[str, int] | None = None

    @property
    def address(self) -> tuple[str, int]:
        if self._address is None:
            raise ServerStateError("server not started")
        return self._address

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{join_host_port(host, port)}"

    async def start(self) -> tuple[str, int]:
        """Bind the API (and load the config file, if any); return the bound (host, port)."""
        if self._runner is not None:
            raise ServerStateError("server already started")
        if self._config_path is not None:
            await self._load_config(Path(self._config_path))
        runner = web.AppRunner(make_app(self.registry), access_log=None,
                               handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        bound = runner.addresses[0]
        self._address = (bound[0], bound[1])
        return self._address

    async def _load_config(self, path: Path) -> None:
        try:
            entries = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ToxiproxyError(f"cannot read config {path}: {exc}") from exc
        async with self.registry.lock:
            await self.registry.populate(entries)

    async def stop(self) -> None:
        """Close the API and every proxy with its connections."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        async with self.registry.lock:
            await self.registry.close()


async def _cancel_other_tasks(timeout_s: float) -> None:
    """Cancel what is left on the loop (connection tasks winding down) and wait for it."""
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in others:
        task.cancel()
    if others:
        await asyncio.wait(others, timeout=timeout_s)


class ServerThread:
    """Runs a ``ToxiproxyServer`` on its own event loop thread, for synchronous callers.

    Use as a context manager or call ``start()``/``stop()``. ``url`` is the API base URL.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, **server_options: Any) -> None:
        self.server = ToxiproxyServer(host, port, **server_options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self.server.address

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> tuple[str, int]:
        if self._thread is not None:
            raise ServerStateError("server thread already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="toxiproxy", daemon=True)
        self._thread.start()
        address: tuple[str, int] = self.call(self.server.start(), THREAD_START_TIMEOUT_S)
        return address

    def call(self, coroutine: Any, timeout_s: float = THREAD_STOP_TIMEOUT_S) -> Any:
        """Run a coroutine on the server's loop and wait (bounded) for its result."""
        if self._loop is None:
            raise ServerStateError("server thread not started")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            self.call(self.server.stop(), THREAD_STOP_TIMEOUT_S)
            self.call(_cancel_other_tasks(THREAD_STOP_TIMEOUT_S / 2), THREAD_STOP_TIMEOUT_S)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(THREAD_STOP_TIMEOUT_S)
            if not thread.is_alive():
                loop.close()
            self._loop = self._thread = None

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


__all__ = ["ServerStateError", "ServerThread", "ToxiproxyServer"]
