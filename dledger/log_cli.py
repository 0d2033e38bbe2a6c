"""``dledger log ...``: commands for a bare replicated-log group (no broker): ``log up``,
``log status``, ``log propose``, ``log read``, ``log leader transfer``. Registered by cli.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

import click

from dledger.client import LogClient
from dledger.localcluster import ClusterError, LocalCluster
from dledger.node_cli import parse_address, parse_peers, tls_ca_option
from protocol.errors import DLedgerError
from protocol.tls import TlsConfigError, dial_context

WATCH_MIN_S = 0.5  # each round asks every node: a shorter period only loads the group


@click.group()
def main() -> None:
    """A bare replicated-log group: the commitlog without a broker on top."""


# -- dledger up ------------------------------------------------------------------------------------


@main.command()
@click.option("--replicas", type=click.IntRange(1, 9), default=3, show_default=True,
              help="Nodes in the group.")
@click.option("--group", default="g", show_default=True)
@click.option("--data-dir", default="./data", show_default=True, type=click.Path(file_okay=False))
@click.option("--flush-mode", type=click.Choice(["sync", "async"]), default="sync", show_default=True)
@click.option("--peer-port", type=int, default=20911, show_default=True,
              help="Peer port of n0 (n1, n2 ... count up); 0 picks free ports.")
@click.option("--client-port", type=int, default=10911, show_default=True,
              help="Client port of n0 (n1, n2 ... count up); 0 picks free ports.")
@click.option("--exit-after-s", type=float, default=None, help="Stop by itself after this long.")
def up(replicas: int, group: str, data_dir: str, flush_mode: str, peer_port: int,
       client_port: int, exit_after_s: float | None) -> None:
    """Start a local group of log servers in the foreground; Ctrl-C stops them all."""
    cluster = LocalCluster(os.path.abspath(data_dir), size=replicas, group=group,
                           flush_mode=flush_mode, peer_port=peer_port, client_port=client_port)
    stop = {"now": False}

    def on_signal(signum: int, frame: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        cluster.start()
    except ClusterError as err:
        cluster.stop()
        raise click.ClickException(_start_failure(str(err))) from err
    with cluster:
        nodes = cluster.client_addresses
        leader = asyncio.run(_wait_healthy(nodes, timeout_s=30))
        click.echo(f"group {group}: {replicas} nodes, flush mode {flush_mode}, data in {data_dir}")
        for nid, s in cluster.servers.items():
            mark = "  (leader)" if nid == leader else ""
            click.echo(f"  {nid}: client {_fmt(s.client_address)}  peer {_fmt(s.peer_address)}{mark}")
        arg = _nodes_arg(nodes)
        click.echo(f"\nconnect:  dledger log status --nodes {arg}")
        click.echo(f"          dledger log propose --nodes {arg} 'hello'")
        click.echo("Ctrl-C stops the group.")
        deadline = time.monotonic() + exit_after_s if exit_after_s else None
        while not stop["now"] and (deadline is None or time.monotonic() < deadline):
            dead = [n for n, s in cluster.servers.items() if not s.running]
            if dead:
                click.echo(f"node(s) {dead} exited; stopping", err=True)
                sys.exit(1)
            time.sleep(0.2)  # the foreground wait of an interactive command
        click.echo("stopping...")


def _start_failure(detail: str) -> str:
    """The useful line of a server that did not start (the last line of its log)."""
    lines = [ln.strip() for ln in detail.splitlines() if ln.strip()]
    cause = lines[-1] if len(lines) > 1 else ""
    return f"{lines[0] if lines else 'a node did not start'} {cause}".strip()


async def _wait_healthy(nodes: dict[str, tuple[str, int]], timeout_s: float) -> str:
    async with LogClient(nodes, timeout_s=2.0) as client:
        try:
            return await client.wait_for_leader(timeout_s)
        except DLedgerError as err:
            raise click.ClickException(str(err)) from err


def _fmt(addr: tuple[str, int]) -> str:
    return f"{addr[0]}:{addr[1]}"


def _nodes_arg(nodes: dict[str, tuple[str, int]]) -> str:
    return ",".join(f"{n}={_fmt(a)}" for n, a in nodes.items())


# -- client commands -----------------------------------------------------------------------------------

NODES_HELP = "Client addresses of the group: n0=host:port,n1=host:port,..."


def nodes_option(f: Any) -> Any:
    """``--nodes`` and ``--tls-ca`` (log servers started with ``--tls-cert``: docs/tls.md)."""
    return tls_ca_option("The group")(click.option("--nodes", required=True, help=NODES_HELP)(f))


def _client(addrs: dict[str, tuple[str, int]], **kw: Any) -> LogClient:
    """A client of the group: TLS when a CA is set (``--tls-ca``/DLEDGER_TLS_CA)."""
    try:
        return LogClient(addrs, ssl_context=dial_context(None), **kw)
    except TlsConfigError as err:
        raise click.ClickException(str(err)) from err


@main.command()
@nodes_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--watch", type=click.FloatRange(min=WATCH_MIN_S), default=None, metavar="SECONDS",
              help=f"Repeat every SECONDS (at least {WATCH_MIN_S}) until interrupted.")
def status(nodes: str, as_json: bool, watch: float | None) -> None:
    """Role, term, indexes and follower lag of every node; exit 2 if there is no leader (with
    --watch: repeat until interrupted)."""
    addrs = parse_peers(nodes)
    while True:
        rows = asyncio.run(_statuses(addrs))
        if as_json:
            click.echo(json.dumps(rows, indent=2))
        else:
            click.echo(_status_table(rows))
        if watch is None:
            break
        time.sleep(watch)
    if not any(r.get("role") == "leader" for r in rows):
        sys.exit(2)


async def _statuses(addrs: dict[str, tuple[str, int]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async with _client(addrs, timeout_s=2.0) as client:
        for nid in addrs:
            try:
                st = await client.status(nid)
            except DLedgerError as err:
                out.append({"node": nid, "role": "unreachable", "error": str(err)})
                continue
            raft = st["raft"]
            out.append({"node": nid, "role": raft["role"], "term": raft["term"],
                        "leader": raft["leader_id"], "last_index": raft["last_index"],
                        "commit_index": raft["commit_index"], "applied_index": raft["applied_index"],
                        "flush_mode": st["flush_mode"],
                        "followers": {f["node_id"]: {"match_index": f["match_index"],
                                                     "lag": raft["last_index"] - f["match_index"],
                                                     "last_contact_ticks": f["last_contact_ticks"]}
                                      for f in raft["followers"]}})
    return out


def _status_table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'node':<6} {'role':<12} {'term':>5} {'leader':<7} {'last':>8} {'commit':>8} "
            f"{'applied':>8}  followers (lag, last contact ticks)")
    lines = [head]
    for r in rows:
        if r["role"] == "unreachable":
            lines.append(f"{r['node']:<6} unreachable  {r['error']}")
            continue
        fol = ", ".join(f"{n}: {f['lag']} / {f['last_contact_ticks']}" for n, f in r["followers"].items())
        lines.append(f"{r['node']:<6} {r['role']:<12} {r['term']:>5} {r['leader']!s:<7} "
                     f"{r['last_index']:>8} {r['commit_index']:>8} {r['applied_index']:>8}  {fol}")
    return "\n".join(lines)


@main.command()
@nodes_option
@click.argument("data", nargs=-1, required=True)
def propose(nodes: str, data: tuple[str, ...]) -> None:
    """Commit each DATA argument as one entry; prints index, term and position."""
    async def run() -> None:
        async with _client(parse_peers(nodes)) as client:
            for item in data:
                node, c = await client.propose(item.encode())
                click.echo(f"committed index {c.index} term {c.term} position {c.position} (via {node})")
    _run_client(run())


@main.command()
@nodes_option
@click.option("--node", "node_id", default=None, help="Read from this node (default: the leader).")
@click.option("--from-index", type=int, default=1, show_default=True)
@click.option("--max", "max_entries", type=int, default=100, show_default=True)
def read(nodes: str, node_id: str | None, from_index: int, max_entries: int) -> None:
    """Print committed entries as stored on one node."""
    addrs = parse_peers(nodes)

    async def run() -> None:
        async with _client(addrs) as client:
            node = node_id
            if node is None:
                rows = await _statuses(addrs)
                node = next((r["node"] for r in rows if r.get("role") == "leader"), next(iter(addrs)))
            for e in await client.read(node, from_index, max_entries):
                click.echo(f"{e.index}\tterm {e.term}\t{e.kind.name}\tpos {e.position}\t{e.data!r}")
    _run_client(run())


@main.group()
def leader() -> None:
    """Leadership commands."""


@leader.command("transfer")
@nodes_option
@click.argument("to")
def leader_transfer(nodes: str, to: str) -> None:
    """Hand leadership to node TO (it is caught up first)."""
    addrs = parse_peers(nodes)

    async def run() -> None:
        async with _client(addrs) as client:
            rows = await _statuses(addrs)
            current = next((r["node"] for r in rows if r.get("role") == "leader"), None)
            if current is None:
                raise click.ClickException("no leader to transfer from")
            await client.transfer(current, to)
            click.echo(f"leadership moved from {current} to {to}")
    _run_client(run())


def _run_client(coro: Any) -> None:
    try:
        asyncio.run(coro)
    except DLedgerError as err:
        raise click.ClickException(f"{type(err).__name__}: {err}") from err


__all__ = ["main", "parse_address"]
