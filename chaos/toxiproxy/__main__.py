"""Command line: run the Toxiproxy-compatible server until SIGINT or SIGTERM.

    python -m chaos.toxiproxy --host 127.0.0.1 --port 8474 [--config proxies.json] [--seed N]

Owns argument parsing and signal handling only; the server itself is ``server.ToxiproxyServer``.
It runs as dledger's servers do (``dledger.evloop``: uvloop, the collector's thresholds raised):
every byte of a chaos run passes through it, and it shares the cores with the nodes it proxies.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import click

from chaos.toxiproxy.server import ToxiproxyServer
from dledger import evloop


async def _serve(server: ToxiproxyServer) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    host, port = await server.start()
    print(f"toxiproxy API listening on {host}:{port}", flush=True)
    try:
        await stop.wait()  # runs until a signal: no deadline by design
    finally:
        await server.stop()


@click.command()
@click.option("--host", default="localhost", show_default=True, help="API host to bind.")
@click.option("--port", default=8474, show_default=True, type=int, help="API port (0: any).")
@click.option("--config", "config_path", default=None, help="JSON array of proxies to create.")
@click.option("--seed", default=None, type=int, help="Seed for jitter, toxicity and slicer.")
@click.option("--log-level", default="WARNING", show_default=True)
def main(host: str, port: int, config_path: str | None, seed: int | None, log_level: str) -> None:
    """Run a Toxiproxy-compatible server."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr)
    evloop.run(_serve(ToxiproxyServer(host, port, seed=seed, config_path=config_path)), server=True)


if __name__ == "__main__":
    main()
