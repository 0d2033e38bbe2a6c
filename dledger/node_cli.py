"""The command-line options of a replicated-log node, shared by every server process that hosts
one (``python -m dledger.server``, ``dledger-broker start``): the options themselves, parsing of
peer lists and addresses, and turning them into a ``NodeConfig`` with clear usage errors."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import click

from dledger import logfmt
from dledger.logfmt import (
    LOG_FORMAT_ENV,
    LOG_FORMATS,
    LOG_LEVEL_DEFAULT,
    LOG_LEVELS,
    LOG_STREAM_ENV,
    LOG_STREAMS,
)
from dledger.node.runtime import MAX_BUSY_POLL_US, Address, Node, NodeConfig
from dledger.raft.config import SIM_ONLY_CANARIES, Canaries
from protocol.framed import (
    CONNECTIONS_MAX_DEFAULT,
    INPUT_BUFFER_BYTES_MAX_DEFAULT,
    ConnectionLimits,
)
from protocol.log_summary import CLIENT_CONNECTION_ERRORS
from protocol.tls import ENV_CA, TlsConfig, TlsConfigError

F = TypeVar("F", bound=Callable[..., Any])

# A node started from the command line polls for up to 300 us when a message is due and
# replicates quorum first: measured with `python -m bench.flags` (docs/performance.md),
# both lowered one producer's p50 by 10-17 % at the same or less CPU per message, for 0.1 % of
# a core more when idle (over 3 nodes). NodeConfig keeps both off: nodes sharing one process
# (the in-process tests) would poll against each other.
DEFAULT_BUSY_POLL_US = 300


def _take_tls_ca(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """``--tls-ca FILE``: this command's connections are TLS, verified against FILE. Exported
    as DLEDGER_TLS_CA, the client libraries' own setting, so that every client the command
    makes follows it."""
    if value:
        if not os.path.isfile(value):
            raise click.BadParameter(f"{value!r} is not a readable file", ctx, param)
        os.environ[ENV_CA] = value


def tls_ca_option(what: str) -> Callable[[F], F]:
    """A command's ``--tls-ca FILE`` (default $DLEDGER_TLS_CA): speak TLS to ``what``."""
    return click.option("--tls-ca", type=click.Path(dir_okay=False), envvar=ENV_CA,
                        expose_value=False, is_eager=True, callback=_take_tls_ca,
                        help=f"{what}'s CA file: speak TLS to it (default from "
                             "$DLEDGER_TLS_CA; docs/tls.md).")


def parse_address(text: str) -> Address:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise click.BadParameter(f"expected HOST:PORT, got {text!r}")
    return host or "127.0.0.1", int(port)


def parse_peers(text: str) -> dict[str, Address]:
    """``n0=h:p,n1=h:p`` or DLedger's ``n0-h:p;n1-h:p``."""
    out: dict[str, Address] = {}
    for part in text.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        if "=" in part:
            nid, addr = part.split("=", 1)
        elif "-" in part:
            nid, addr = part.split("-", 1)
        else:
            raise click.BadParameter(f"expected ID=HOST:PORT, got {part!r}")
        if nid.strip() in out:
            raise click.BadParameter(f"node {nid.strip()!r} is listed twice")
        out[nid.strip()] = parse_address(addr.strip())
    if not out:
        raise click.BadParameter("no peers given")
    return out


def load_config_file(ctx: click.Context, param: click.Parameter, path: str | None) -> None:
    """``--config FILE``: a TOML file whose keys are the command's long options (``data-dir`` or
    ``data_dir``; ``peers`` may be a table ``{n0 = "host:port", ...}``). Its values become the
    defaults, so an option on the command line still wins. Unknown keys are refused by name."""
    if not path:
        return
    import tomllib  # (only with --config: 0.5 MiB a process otherwise)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise click.BadParameter(f"{path}: {err}", ctx, param) from err
    names = {opt.lstrip("-").replace("-", "_"): p.name for p in ctx.command.params
             for opt in getattr(p, "opts", ()) if opt.startswith("--")}
    defaults: dict[str, Any] = {}
    for key, value in data.items():
        name = names.get(key.replace("-", "_"))
        if name is None or name == "config":
            raise click.BadParameter(f"{path}: unknown setting {key!r}", ctx, param)
        if isinstance(value, dict) and key in ("peers", "dial"):
            value = ",".join(f"{nid}={addr}" for nid, addr in value.items())
        defaults[name] = value
    ctx.default_map = {**(ctx.default_map or {}), **defaults}


_OPTIONS = [
    click.option("--config", type=click.Path(dir_okay=False), is_eager=True, expose_value=False,
                 callback=load_config_file,
                 help="TOML file of option values (command-line options override it)."),
    click.option("--group", required=True, help="Name of the Raft group."),
    click.option("--id", "node_id", required=True, help="This node's id (one of --peers)."),
    click.option("--peers", required=True,
                 help="Every member: n0=host:port,n1=... (or n0-host:port;...)."),
    click.option("--dial", default="", help="Per-peer dial overrides: n1=host:port,... (fault proxies)."),
    click.option("--data-dir", required=True, type=click.Path(file_okay=False)),
    click.option("--flush-mode", type=click.Choice(["sync", "async"]), default="sync",
                 show_default=True),
    click.option("--async-flush-ms", type=int, default=50, show_default=True,
                 help="In async flush mode, fsync this often."),
    click.option("--tick-ms", type=int, default=100, show_default=True),
    click.option("--election-ticks", type=int, default=10, show_default=True),
    click.option("--preferred-leader", default=None),
    click.option("--retention-entries", type=click.IntRange(min=1), default=None,
                 help="Delete old log segments, keeping at least this many entries (and all "
                      "that a member still needs). Default: keep everything."),
    click.option("--retention-lag-entries", type=click.IntRange(min=0), default=1_000_000,
                 show_default=True,
                 help="With snapshots (a broker): retention keeps what a lagging member needs "
                      "only while it is within this many entries of the log's end; a member "
                      "further behind is sent a snapshot instead."),
    click.option("--file-reserved-hours", type=click.FloatRange(min=0), default=72.0,
                 show_default=True,
                 help="With snapshots (a broker): a log segment last written longer ago than "
                      "this is deleted at the --delete-when hours, or at once when the disk is "
                      "fuller than --disk-max-used-ratio (RocketMQ's fileReservedTime)."),
    click.option("--delete-when", default="04", show_default=True, metavar="HH[;HH...]",
                 help="Local hours at which expired log segments are deleted (RocketMQ's "
                      "deleteWhen)."),
    click.option("--disk-max-used-ratio", type=click.FloatRange(0, 1), default=0.75,
                 show_default=True,
                 help="Past this share of the disk used, expired segments go at any hour."),
    click.option("--disk-clean-forcibly-ratio", type=click.FloatRange(0, 1), default=0.85,
                 show_default=True,
                 help="Past this share of the disk used, the oldest segment goes even if it "
                      "has not expired (never past the latest checkpoint)."),
    click.option("--segment-bytes", type=click.IntRange(min=4096), default=64 << 20,
                 show_default=True, help="Size of a commitlog segment file."),
    click.option("--snapshot-timeout-s", type=click.FloatRange(min=0.1), default=10.0,
                 show_default=True,
                 help="Each wait of a snapshot transfer (connecting, a chunk, an answer)."),
    click.option("--busy-poll-us", type=click.IntRange(0, MAX_BUSY_POLL_US),
                 default=DEFAULT_BUSY_POLL_US, show_default=True,
                 help="A node expecting a message (a leader awaiting acknowledgements, a "
                      "follower that just acknowledged entries) polls this long after its last "
                      "turn before it sleeps, and waits for a lone entry's fsync by polling for "
                      "up to this long: lower commit latency, paid for in CPU while it polls."),
    click.option("--quorum-first/--no-quorum-first", default=True, show_default=True,
                 help="A leader sends each new entry at once only to the followers its commit "
                      "needs; the others get entries in batches and at every heartbeat."),
    click.option("--aio-fsync/--no-aio-fsync", default=True, show_default=True,
                 help="Run the fsyncs the node does not do inline through Linux AIO, where "
                      "available, rather than on a thread."),
    click.option("--max-connections", type=click.IntRange(min=1), default=CONNECTIONS_MAX_DEFAULT,
                 show_default=True,
                 help="Client connections open at once; one more is answered OVERLOADED and "
                      "closed (the peer port has no such limit: Raft traffic is never starved)."),
    click.option("--input-buffer-bytes-max", type=click.IntRange(min=1),
                 default=INPUT_BUFFER_BYTES_MAX_DEFAULT, show_default=True,
                 help="Bytes of partly received frames all client connections may hold "
                      "together; past it the connections holding the most are closed."),
    click.option("--tls-cert", type=click.Path(dir_okay=False), default=None,
                 help="Serve TLS on every listener with this certificate (PEM; with --tls-key "
                      "and --tls-ca). Off unless given (docs/tls.md)."),
    click.option("--tls-key", type=click.Path(dir_okay=False), default=None,
                 help="The private key of --tls-cert (PEM)."),
    click.option("--tls-ca", type=click.Path(dir_okay=False), default=None,
                 help="The CA that signed the cluster's certificates: peers, NameServers and "
                      "admin endpoints are verified against it when dialed."),
    click.option("--peer-mtls", is_flag=True,
                 help="Mutual TLS on peer links: a dialing peer must present a certificate "
                      "signed by --tls-ca (this node presents --tls-cert when dialing)."),
    click.option("--join", is_flag=True,
                 help="Join a running group (a new member, or one whose disk was replaced): "
                      "take the membership from the leader; add the node with `dledger group "
                      "add-node` (--peers need only name this node and one member)."),
    click.option("--slow-fsync-ms", type=click.IntRange(min=0), default=500, show_default=True,
                 help="An fsync slower than this is logged (at most one line per 10 s, with the "
                      "count and the slowest)."),
    click.option("--log-format", type=click.Choice(LOG_FORMATS), default="text", show_default=True,
                 envvar=LOG_FORMAT_ENV, show_envvar=True,
                 help="Log lines as text or as JSON objects (one event per line, with group, "
                      "node and term; the term is null until the node has read its state)."),
    click.option("--log-stream", type=click.Choice(LOG_STREAMS), default="stderr",
                 show_default=True, envvar=LOG_STREAM_ENV, show_envvar=True,
                 help="Where the log lines go (the image sets stdout: a container's log)."),
    click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False),
                 default=LOG_LEVEL_DEFAULT, show_default=True,
                 help="INFO: start and stop, elections and leader changes, membership, "
                      "snapshots, retention, a full disk, refusals, slow fsyncs and a "
                      "rate-limited summary of client connection errors (docs/operations.md)."),
    click.option("--test-faults", is_flag=True, help="Allow power-loss requests (tests only)."),
    click.option("--test-crash-in-install", type=click.Choice(["staged", "commit"]), default=None,
                 hidden=True, help="Exit at this step of the first snapshot install (tests only)."),
    click.option("--trace", "trace_path", default=None, type=click.Path(dir_okay=False),
                 help="Append an event trace (JSON lines: roles, votes, commits) to this file."),
    click.option("--canary", multiple=True,
                 type=click.Choice(sorted(set(Canaries.__dataclass_fields__) - SIM_ONLY_CANARIES)),
                 help="Seeded bug (tests only; needs --test-faults)."),
]
NODE_OPTION_NAMES = ("group", "node_id", "peers", "dial", "data_dir", "flush_mode",
                     "async_flush_ms", "tick_ms", "election_ticks", "preferred_leader",
                     "retention_entries", "retention_lag_entries", "segment_bytes",
                     "file_reserved_hours", "delete_when", "disk_max_used_ratio",
                     "disk_clean_forcibly_ratio",
                     "snapshot_timeout_s", "busy_poll_us", "quorum_first", "aio_fsync", "join", "test_faults",
                     "test_crash_in_install",
                     "trace_path", "canary", "tls_cert", "tls_key", "tls_ca", "peer_mtls",
                     "slow_fsync_ms")


def node_options(f: F) -> F:
    for option in reversed(_OPTIONS):
        f = option(f)
    return f


def node_config(opts: dict[str, Any]) -> NodeConfig:
    """A NodeConfig from the node options (other keys of ``opts`` are left alone)."""
    o = {k: opts[k] for k in NODE_OPTION_NAMES}
    members = parse_peers(o["peers"])
    # (a --dial entry may name a node not in --peers: one that joins the group later)
    dials = parse_peers(o["dial"]) if o["dial"] else {}
    try:
        tls = TlsConfig.from_options(o["tls_cert"], o["tls_key"], o["tls_ca"], o["peer_mtls"])
    except TlsConfigError as err:
        raise click.UsageError(str(err)) from err
    try:
        return NodeConfig(
            group=o["group"], node_id=o["node_id"], peers=members, data_dir=o["data_dir"],
            dial=dials, flush_mode=o["flush_mode"], async_flush_interval_s=o["async_flush_ms"] / 1000,
            tick_interval_s=o["tick_ms"] / 1000, election_ticks=o["election_ticks"],
            preferred_leader=o["preferred_leader"], retention_entries=o["retention_entries"],
            retention_lag_entries=o["retention_lag_entries"], segment_bytes_max=o["segment_bytes"],
            file_reserved_hours=o["file_reserved_hours"], delete_hours=parse_hours(o["delete_when"]),
            disk_max_used_ratio=o["disk_max_used_ratio"],
            disk_forcibly_ratio=o["disk_clean_forcibly_ratio"],
            snapshot_timeout_s=o["snapshot_timeout_s"],
            busy_poll_us=o["busy_poll_us"], quorum_first=o["quorum_first"],
            aio_fsync=o["aio_fsync"], join=o["join"], test_faults=o["test_faults"],
            test_crash_in_install=o["test_crash_in_install"],
            trace_path=o["trace_path"], canaries=Canaries(**{c: True for c in o["canary"]}),
            tls=tls, slow_fsync_s=o["slow_fsync_ms"] / 1000)
    except ValueError as err:
        raise click.UsageError(str(err)) from err


def parse_hours(text: str) -> tuple[int, ...]:
    """RocketMQ's deleteWhen: hours of the day separated by ';' ("04", "04;16")."""
    hours = []
    for part in text.split(";"):
        part = part.strip()
        if not part.isdigit() or not 0 <= int(part) <= 23:
            raise ValueError(f"--delete-when takes hours 00..23 separated by ';', not {text!r}")
        hours.append(int(part))
    return tuple(hours)


def client_limits(opts: dict[str, Any]) -> ConnectionLimits:
    """The client listener's limits from ``--max-connections`` and ``--input-buffer-bytes-max``."""
    return ConnectionLimits(opts["max_connections"], opts["input_buffer_bytes_max"])


def setup_logging(opts: dict[str, Any], program: str) -> None:
    """Logging as ``--log-format`` and ``--log-level`` say (``dledger.logfmt``), then the log's
    first line: ``program``, its version and the command's options (secrets never shown)."""
    logfmt.configure(opts.get("log_format", "text"), opts.get("log_level", LOG_LEVEL_DEFAULT),
                     opts.get("log_stream", "stderr"))
    # (the term is not known before the node has read its state: null until bind_log_context)
    where = {"group": opts.get("group"), "node": opts.get("node_id"), "term": None}
    logfmt.bind_context(lambda: where)  # (with the term once the node exists: bind_log_context)
    ctx = click.get_current_context(silent=True)
    logfmt.log_start(program, ctx.params if ctx is not None else opts)


def node_where(node: Node) -> dict[str, Any]:
    """The node's group, id and current term: what every log line and the ready line carry."""
    return {"group": node.config.group, "node": node.config.node_id,
            "term": node.core.term if node.core is not None else 0}


def bind_log_context(node: Node) -> None:
    """Stamp every log record with the node's group, id and current term."""
    logfmt.bind_context(lambda: node_where(node))


async def _power_loss(server: NodeServer) -> None:
    """Discard every log byte not yet fsynced (tearing the last write), then die at once, as a
    machine whose power failed: no clean stop, no flush, no checkpoint."""
    discarded = await server.node.power_loss(tear=True)
    logging.getLogger("dledger.node").warning("power loss: discarded_bytes=%d", discarded)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(137)


class NodeServer(Protocol):
    @property
    def node(self) -> Node: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def serve_until_signal(server: NodeServer, ready: Callable[[], dict[str, Any]],
                             program: str = "dledger-server") -> None:
    """Start ``server``, print the JSON ready line (``ready()`` gives its fields, read after
    start so ports are real; ``node_where`` too), run until SIGTERM/SIGINT or until the node's
    loop ends on its own, stop cleanly; exit 1 if the node failed. With TLS, SIGHUP reloads the
    certificate, key and CA files for new connections (without TLS it keeps its default: the
    process ends).
    Logs when it serves (its addresses) and when it stopped (why, and after how long)."""
    started_at_s = time.monotonic()
    bind_log_context(server.node)
    await server.start()
    fields = ready()
    # (with the group, node and term of every log line: a container's stdout is all JSON lines)
    print(json.dumps({"event": "ready", **fields, **node_where(server.node)}), flush=True)
    logging.getLogger("dledger.process").info(
        "%s serving: %s", program, " ".join(f"{k}={_address_text(v)}" for k, v in fields.items()
                                            if v))
    stop = asyncio.Event()
    why = ["its loop ended"]

    def on_signal(sig: signal.Signals) -> None:
        why[0] = sig.name
        stop.set()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    cfg = server.node.config
    if cfg.tls is not None:
        from dledger.network.tls_reload import TlsReloader  # (cryptography: with TLS only)
        loop.add_signal_handler(signal.SIGHUP, TlsReloader(cfg.tls, (cfg.group, cfg.node_id)).reload)
    if server.node.config.test_faults:  # SIGUSR1: pull the plug (tests only)
        loop.add_signal_handler(signal.SIGUSR1, lambda: asyncio.ensure_future(_power_loss(server)))
    waiter = asyncio.ensure_future(stop.wait())
    joined = asyncio.ensure_future(server.node.join())
    await asyncio.wait({waiter, joined}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    joined.cancel()
    await server.stop()
    CLIENT_CONNECTION_ERRORS.flush()
    logfmt.log_stop(program, started_at_s, why[0], server.node.failure)
    if server.node.failure is not None:
        sys.exit(1)


def _address_text(value: Any) -> str:
    if isinstance(value, list) and len(value) == 2:
        return f"{value[0]}:{value[1]}"
    return str(value)
