"""``dledger producer list [GROUP]``: the producer groups' live members, as each broker node
knows them from their heartbeats (a transactional producer's check-backs go to one of them)."""

from __future__ import annotations

import asyncio
from typing import Any

import click

from cli.common import namesrv_option, with_routes
from client.cluster.routes import GroupRoute, Routes
from protocol import broker_kinds as bp
from protocol.errors import DLedgerError

STATUS_TIMEOUT_S = 3.0


@click.group()
def producer() -> None:
    """Producer groups."""


@producer.command("list")
@namesrv_option
@click.argument("group", required=False)
def producer_list(namesrv: tuple[str, ...], group: str | None) -> None:
    """The live producers of GROUP (of every producer group if none is named), per broker node;
    and each broker group's open transactions."""
    async def show(routes: Routes) -> None:
        groups = await routes.cluster_groups()
        rows: list[tuple[str, str, str, str]] = []
        for g in groups:
            statuses = await asyncio.gather(*(_status(routes, g, n) for n in sorted(g.nodes)))
            for node, st in zip(sorted(g.nodes), statuses):
                if st is None:
                    rows.append(("?", "?", f"{g.group}/{node}", "unreachable"))
                    continue
                txns = st.get("transactions", {})
                for pg, members in txns.get("producer_groups", {}).items():
                    if group is None or pg == group:
                        rows += [(pg, m, f"{g.group}/{node}", "") for m in members]
                if st.get("raft", {}).get("role") == "leader":
                    click.echo(f"group {g.group}: {txns.get('open', 0)} open transactions "
                               f"(leader {node})")
        if not any(r[3] == "" for r in rows):
            click.echo(f"no live producer{' of ' + group if group else ''}")
        for pg, member, where, note in sorted(rows):
            click.echo(f"{pg:<20} {member:<32} {where}{'  ' + note if note else ''}")
    with_routes(namesrv, show)


async def _status(routes: Routes, g: GroupRoute, node: str) -> dict[str, Any] | None:
    try:
        st: dict[str, Any] = await routes.group_client(g).call(node, bp.BROKER_STATUS,
                                                               timeout_s=STATUS_TIMEOUT_S)
        return st
    except DLedgerError:
        return None
