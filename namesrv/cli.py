"""Command line: run a NameServer until SIGINT or SIGTERM (with TLS, SIGHUP reloads its certificate,
key and CA files for new connections: ``dledger.network.tls_reload``).

    python -m namesrv --listen 127.0.0.1:9876 [--lease-s 120] [--scan-interval-s 5]
                      [--console-read-only] [--tls-cert FILE --tls-key FILE --tls-ca FILE]
                      [--cluster-key-file FILE | --insecure]

Prints exactly one line on stdout once bound, ``{"event":"ready","listen":[host,port]}`` with the
real port (``--listen host:0`` picks one), then logs on stderr at INFO (``--log-level`` to change;
``--log-format json``: JSON lines): start and stop with its version and options, registrations,
expiries and refusals, leader changes (docs/operations.md). Owns argument parsing, the ready
line and signal handling; the server is ``server.NameServer``. ``cli`` is the same command as a
``start`` subcommand, for a ``dledger-namesrv start`` script. The entry point that runs either is
``namesrv.__main__`` (it decides first whether the process loads OpenSSL: ``dledger.openssl``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from collections.abc import Callable

import click

from dledger import logfmt
from dledger.logfmt import LOG_FORMATS, LOG_LEVEL_DEFAULT, LOG_LEVELS
from namesrv.errors import BadRequestError
from namesrv.model import parse_host_port
from namesrv.registration_auth import NAMESRV_CANARIES
from namesrv.registry import LEASE_S_DEFAULT
from namesrv.server import SCAN_INTERVAL_S_DEFAULT, NameServer
from protocol.cluster_key import CLUSTER_KEY_ENV, KEY_FILE_ENV, ClusterKeyError, load_cluster_key
from protocol.log_summary import CLIENT_CONNECTION_ERRORS
from protocol.tls import TlsConfig, TlsConfigError


async def _serve(server: NameServer) -> None:
    started_at_s = time.monotonic()
    stop = asyncio.Event()
    why = ["its serving ended"]

    def on_signal(signum: signal.Signals) -> None:
        why[0] = signum.name
        stop.set()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    if server.tls is not None:  # SIGHUP: its certificate, key and CA again, for new connections
        from dledger.network.tls_reload import TlsReloader  # (cryptography: with TLS only)
        loop.add_signal_handler(signal.SIGHUP, TlsReloader(server.tls).reload)
    try:
        host, port = await server.start()
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {server.host}:{server.port}: {exc}") from exc
    print(json.dumps({"event": "ready", "listen": [host, port]}, separators=(",", ":")),
          flush=True)
    logfmt.bind_context(lambda: {"namesrv": f"{host}:{port}"})  # (the bound port: --listen's :0)
    logging.getLogger("dledger.process").info("dledger-namesrv serving at %s:%d", host, port)
    try:
        await stop.wait()  # runs until a signal: no deadline by design
    finally:
        await server.stop()
        CLIENT_CONNECTION_ERRORS.flush()
        logfmt.log_stop("dledger-namesrv", started_at_s, why[0])


def _listen(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, int]:
    try:
        return parse_host_port(value, "--listen", allow_port_zero=True)
    except BadRequestError as exc:
        raise click.BadParameter(str(exc)) from exc


_OPTIONS = [
    click.option("--listen", default="127.0.0.1:9876", show_default=True, callback=_listen,
                 help="host:port to serve the HTTP API on (port 0: any free port)."),
    click.option("--lease-s", default=LEASE_S_DEFAULT, show_default=True,
                 type=click.FloatRange(min=0, min_open=True),
                 help="Drop a registration not refreshed within this many seconds."),
    click.option("--scan-interval-s", default=SCAN_INTERVAL_S_DEFAULT, show_default=True,
                 type=click.FloatRange(min=0, min_open=True),
                 help="How often expired registrations are dropped."),
    click.option("--console-read-only", is_flag=True,
                 help="The web console (/console) only shows: its actions (create or update a "
                      "topic, leader transfer, offset reset) are refused and hidden."),
    click.option("--tls-cert", type=click.Path(dir_okay=False), default=None,
                 help="Serve the HTTP API over TLS with this certificate (PEM; with --tls-key "
                      "and --tls-ca). Off unless given (docs/tls.md)."),
    click.option("--tls-key", type=click.Path(dir_okay=False), default=None,
                 help="The private key of --tls-cert (PEM)."),
    click.option("--tls-ca", type=click.Path(dir_okay=False), default=None,
                 help="The CA of the cluster: brokers' admin endpoints are verified against it "
                      "when a registration's term is checked."),
    click.option("--cluster-key-file", type=click.Path(dir_okay=False), default=None,
                 help=f"The cluster credential (mode 0600) brokers sign their registrations "
                      f"with; or ${KEY_FILE_ENV}, or the credential itself in ${CLUSTER_KEY_ENV}. "
                      "Without one, every registration is refused (docs/security.md)."),
    click.option("--insecure", is_flag=True,
                 help="Accept unsigned registrations too: anyone who reaches the port can "
                      "change the routes. For a closed test network only."),
    click.option("--canary", "canaries", multiple=True, hidden=True,
                 type=click.Choice(sorted(NAMESRV_CANARIES)),
                 help="A seeded bug, for the live chaos checker's tests only."),
    click.option("--log-level", default=LOG_LEVEL_DEFAULT, show_default=True,
                 type=click.Choice(LOG_LEVELS, case_sensitive=False),
                 help="INFO: start and stop, registrations, expiries and refusals, leader "
                      "changes, a rate-limited summary of client connection errors."),
    click.option("--log-format", default="text", show_default=True, type=click.Choice(LOG_FORMATS),
                 envvar=logfmt.LOG_FORMAT_ENV, show_envvar=True,
                 help="Log lines as text or as JSON objects (one event per line)."),
    click.option("--log-stream", default="stderr", show_default=True,
                 type=click.Choice(logfmt.LOG_STREAMS), envvar=logfmt.LOG_STREAM_ENV, show_envvar=True,
                 help="Where the log lines go (the image sets stdout: a container's log)."),
]


def _run(listen: tuple[str, int], lease_s: float, scan_interval_s: float,
         console_read_only: bool, tls_cert: str | None, tls_key: str | None, tls_ca: str | None,
         cluster_key_file: str | None, insecure: bool, canaries: tuple[str, ...],
         log_level: str, log_format: str, log_stream: str) -> None:
    """Run a stateless NameServer (brokers register with every one; clients query any)."""
    logfmt.configure(log_format, log_level, log_stream)
    host, port = listen
    logfmt.bind_context(lambda: {"namesrv": f"{host}:{port}"})
    logfmt.log_start("dledger-namesrv", click.get_current_context().params)
    try:
        tls = TlsConfig.from_options(tls_cert, tls_key, tls_ca)
        cluster_key = load_cluster_key(cluster_key_file, os.environ)
    except (TlsConfigError, ClusterKeyError) as err:
        raise click.UsageError(str(err)) from err
    asyncio.run(_serve(NameServer(host, port, lease_s=lease_s, scan_interval_s=scan_interval_s,
                                  console_read_only=console_read_only, tls=tls,
                                  cluster_key=cluster_key, insecure=insecure,
                                  canaries=frozenset(canaries))))


def _with_options(fn: Callable[..., None]) -> Callable[..., None]:
    for option in reversed(_OPTIONS):
        fn = option(fn)
    return fn


main = click.command(name="namesrv")(_with_options(_run))


@click.group()
def cli() -> None:
    """The NameServer of a dledger cluster."""


cli.add_command(click.command(name="start")(_with_options(_run)))
