"""``dledger group``: a broker group's membership, changed through its leader one node at a time.

    dledger group members a                       # voters, learners, a change in progress
    dledger group add-node a n3 --peer HOST:PORT  # n3 joins as a learner, catches up, votes
    dledger group remove-node a n1                # leadership leaves n1 first if it leads
    dledger group replace-node a n1 n3 --peer HOST:PORT   # add n3, then remove n1

The new node is started first, with ``--join`` (and ``--peers`` naming itself and the members it
should dial), on an empty data directory; it takes the log (a snapshot if the others retained
the start of theirs) as a learner and is promoted once caught up. A removed node may be stopped
once the command returns.
"""

from __future__ import annotations

from typing import Any

import click

from cli.common import groups_of, namesrv_option, with_routes
from client.cluster.routes import GroupRoute, Routes
from protocol import broker_kinds as bp
from protocol.errors import DLedgerError

STEP_TIMEOUT_S = 60.0


@click.group()
def group() -> None:
    """A broker group's members: add, remove or replace a node."""


def _timeout_option(f: Any) -> Any:
    return click.option("--timeout-s", type=click.FloatRange(min=1.0, max=600.0),
                        default=STEP_TIMEOUT_S, show_default=True,
                        help="Deadline of each step (a learner catching up may take a while).")(f)


async def _one(routes: Routes, name: str) -> GroupRoute:
    return (await groups_of(routes, (name,)))[0]


async def _leader_call(routes: Routes, g: GroupRoute, kind: int, *args: Any,
                       timeout_s: float) -> tuple[str, Any]:
    return await routes.call_group_leader(g, kind, *args, timeout_s=timeout_s)


def _show(group_name: str, m: dict[str, Any]) -> str:
    learners = f"; learners {', '.join(m['learners'])}" if m.get("learners") else ""
    change = "; a change in progress" if m.get("change_in_progress") else ""
    return f"group {group_name}: voters {', '.join(m['voters'])}{learners}{change}"


@group.command("members")
@namesrv_option
@click.argument("group_name", metavar="GROUP")
def members(namesrv: tuple[str, ...], group_name: str) -> None:
    """GROUP's voters and learners, as its leader knows them."""
    async def show(routes: Routes) -> None:
        g = await _one(routes, group_name)
        _, st = await _leader_call(routes, g, bp.BROKER_STATUS, timeout_s=10.0)
        click.echo(_show(g.group, st["membership"]))
    with_routes(namesrv, show)


async def _add(routes: Routes, g: GroupRoute, node: str, peer: str, learner: bool,
               timeout_s: float) -> None:
    ms = int(timeout_s * 1000)
    _, m = await _leader_call(routes, g, bp.MEMBER_ADD, node, peer, ms, timeout_s=timeout_s)
    click.echo(f"{node} joined as a learner: {_show(g.group, m)}")
    if not learner:
        _, m = await _leader_call(routes, g, bp.MEMBER_PROMOTE, node, ms, timeout_s=timeout_s)
        click.echo(f"{node} caught up and votes: {_show(g.group, m)}")


async def _remove(routes: Routes, g: GroupRoute, node: str, timeout_s: float) -> None:
    ms = int(timeout_s * 1000)
    leader, st = await _leader_call(routes, g, bp.BROKER_STATUS, timeout_s=timeout_s)
    if leader == node:  # leadership leaves the node first (a short pause, no lost send)
        others = [v for v in st["membership"]["voters"] if v != node]
        if not others:
            raise click.ClickException(f"{node} is the only voter of group {g.group}")
        behind = {f["node_id"]: st["raft"]["last_index"] - f["match_index"]
                  for f in st["raft"]["followers"]}
        to = min(others, key=lambda v: (behind.get(v, 1 << 62), v))
        await _leader_call(routes, g, bp.TRANSFER_LEADERSHIP, to, timeout_s=timeout_s)
        click.echo(f"leadership moved from {node} to {to}")
    _, m = await _leader_call(routes, g, bp.MEMBER_REMOVE, node, ms, timeout_s=timeout_s)
    click.echo(f"{node} removed: {_show(g.group, m)}")


@group.command("add-node")
@namesrv_option
@click.argument("group_name", metavar="GROUP")
@click.argument("node")
@click.option("--peer", "peer", required=True, metavar="HOST:PORT",
              help="The new node's peer address (its --peers entry for itself).")
@click.option("--learner", is_flag=True, help="Leave it a learner (not promoted to voter).")
@_timeout_option
def add_node(namesrv: tuple[str, ...], group_name: str, node: str, peer: str, learner: bool,
             timeout_s: float) -> None:
    """Add NODE to GROUP: a learner first, a voter once it has caught up."""
    async def go(routes: Routes) -> None:
        await _add(routes, await _one(routes, group_name), node, peer, learner, timeout_s)
    with_routes(namesrv, go)


@group.command("remove-node")
@namesrv_option
@click.argument("group_name", metavar="GROUP")
@click.argument("node")
@_timeout_option
def remove_node(namesrv: tuple[str, ...], group_name: str, node: str, timeout_s: float) -> None:
    """Remove NODE from GROUP (leadership moves to another voter first if NODE leads)."""
    async def go(routes: Routes) -> None:
        await _remove(routes, await _one(routes, group_name), node, timeout_s)
    with_routes(namesrv, go)


@group.command("replace-node")
@namesrv_option
@click.argument("group_name", metavar="GROUP")
@click.argument("old")
@click.argument("new")
@click.option("--peer", "peer", required=True, metavar="HOST:PORT",
              help="The new node's peer address.")
@_timeout_option
def replace_node(namesrv: tuple[str, ...], group_name: str, old: str, new: str, peer: str,
                 timeout_s: float) -> None:
    """Replace OLD by NEW in GROUP: add NEW (caught up, voting), then remove OLD."""
    async def go(routes: Routes) -> None:
        g = await _one(routes, group_name)
        await _add(routes, g, new, peer, False, timeout_s)
        try:
            await _remove(routes, g, old, timeout_s)
        except DLedgerError as err:
            raise click.ClickException(f"{new} was added, but removing {old} failed: {err}; "
                                       f"run `dledger group remove-node {g.group} {old}`") from err
    with_routes(namesrv, go)
