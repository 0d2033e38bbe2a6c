"""What the broker-aware commands share: the ``--namesrv`` option (parsed by the broker's and the
client library's parser: ``;`` or ``,`` between addresses, port 9876 by default), NameServer
reads that fall over to the next address, running a command's coroutine with errors shown as
one line (no traceback, no repr, no code said twice), and the broker groups a command acts on."""

from __future__ import annotations

import asyncio
import datetime
import signal
import ssl
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import aiohttp
import click

from client import ClientError
from client.cluster.admin_views import http_error_text
from client.cluster.routes import GroupRoute, Routes, client_error
from dledger.node_cli import tls_ca_option as node_tls_ca_option
from protocol.errors import DLedgerError
from protocol.namesrv_addrs import NameSrvAddressError, parse_namesrv_list
from protocol.tls import HTTPS_PREFIX, TlsConfigError, dial_context, split_https

T = TypeVar("T")
NAMESRV_DEFAULT = "127.0.0.1:9876"
NAMESRV_HELP = ("NameServer address(es): host[:port] separated by ';' or ',' (port 9876 if "
                "none is given; default from $NAMESRV_ADDR, else 127.0.0.1:9876).")
NAMESRV_TIMEOUT_S = 3.0


F = TypeVar("F", bound=Callable[..., Any])


def _parse_namesrv(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    """The addresses, each written ``https://host:port`` when any was (the TLS rule of
    ``protocol.tls.dial_context``, which ``Routes`` and ``namesrv_get`` follow)."""
    try:
        addresses, https = split_https([value])
        parsed = parse_namesrv_list(addresses)
    except NameSrvAddressError as err:
        raise click.BadParameter(str(err), ctx, param) from err
    return tuple(HTTPS_PREFIX + a for a in parsed) if https else parsed


# --tls-ca FILE: every connection of the command (NameServers, brokers, admin endpoints)
tls_ca_option = node_tls_ca_option("The cluster")


def namesrv_option(f: F) -> F:
    """``--namesrv`` (and ``--tls-ca``, which every command that reaches the cluster takes)."""
    f = click.option("--namesrv", default=NAMESRV_DEFAULT, envvar="NAMESRV_ADDR",
                     callback=_parse_namesrv, help=NAMESRV_HELP)(f)
    return tls_ca_option(f)


def http_session(timeout_s: float, https: bool = False) -> tuple[aiohttp.ClientSession, str]:
    """A session for the cluster's HTTP endpoints, and the scheme they speak: https when a CA
    is set (``--tls-ca``/DLEDGER_TLS_CA) or ``https`` says so."""
    try:
        ctx: ssl.SSLContext | None = dial_context(None, https)
    except TlsConfigError as err:
        raise click.ClickException(str(err)) from err
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s),
                                    connector=aiohttp.TCPConnector(ssl=ctx or True))
    return session, "https" if ctx is not None else "http"


async def namesrv_get(namesrv: Sequence[str], path: str,
                      timeout_s: float = NAMESRV_TIMEOUT_S) -> tuple[int, Any]:
    """GET ``path`` (HTTP status, JSON body) from the first NameServer that answers."""
    failures = []
    addresses, https = split_https(list(namesrv))
    session, scheme = http_session(timeout_s, https)
    async with session:
        for addr in addresses:
            try:
                async with session.get(f"{scheme}://{addr}{path}") as resp:
                    return resp.status, await resp.json()
            except (aiohttp.ClientError, TimeoutError, ValueError) as err:
                failures.append(f"{addr} ({http_error_text(err)})")
    raise click.ClickException(f"no NameServer answered: {', '.join(failures)}")


def iso_ms(text: str, option: str) -> int:
    """An ISO 8601 time given to ``option`` as milliseconds since the epoch (a naive time is
    local time, as fromisoformat reads it); a usage error naming the option if it is not one."""
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError as err:
        raise click.BadParameter(f"not an ISO 8601 time: {text!r}", param_hint=f"'{option}'") from err
    return int(when.timestamp() * 1000)


def ms_iso(ms: int) -> str:
    """Milliseconds since the epoch as an ISO 8601 time in UTC, to the millisecond."""
    when = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return when.isoformat(timespec="milliseconds")


def describe(err: DLedgerError | ClientError) -> str:
    """``TypeName: message`` for the user: the client library's name for the error, and the
    broker's code dropped where the name already says it (``TOPIC_NOT_FOUND: TOPIC_NOT_FOUND``
    was what a missing topic printed)."""
    shown = client_error(err) if isinstance(err, DLedgerError) else err
    text = str(err)
    code, sep, rest = text.partition(": ")
    while sep and _is_code(code) and (rest == code or rest.startswith(code + ": ")):
        text = rest  # the broker's error text starts with its code, and the wire adds it again
        code, sep, rest = text.partition(": ")
    if sep and _is_code(code):
        text = rest
    return f"{type(shown).__name__}: {text}"


def _is_code(word: str) -> bool:
    return word.isupper() and word.replace("_", "").isalpha()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; an error of the cluster ends the command with one line."""
    try:
        return asyncio.run(coro)
    except (DLedgerError, ClientError) as err:
        raise click.ClickException(describe(err)) from err


async def groups_of(routes: Routes, only: Sequence[str]) -> list[GroupRoute]:
    """The registered broker groups (only those named, when any are): an error when none is."""
    groups = await routes.cluster_groups()
    if not groups:
        raise click.ClickException("no broker group is registered at the NameServer")
    unknown = sorted(set(only) - {g.group for g in groups})
    if unknown:
        raise click.ClickException(f"no broker group {', '.join(unknown)} is registered "
                                   f"(registered: {', '.join(g.group for g in groups)})")
    return [g for g in groups if not only or g.group in only]


def with_routes(namesrv: Sequence[str], fn: Callable[[Routes], Awaitable[None]]) -> None:
    """Run ``fn`` with the NameServers' routes (closed afterwards)."""
    async def main() -> None:
        routes = Routes(list(namesrv))
        await routes.start()
        try:
            await fn(routes)
        finally:
            await routes.close()
    run(main())


async def until_interrupted(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` until it ends or SIGINT/SIGTERM arrives (then cancel it: a clean exit)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        if not task.cancelled():
            raise  # we were cancelled ourselves, not by a signal
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
