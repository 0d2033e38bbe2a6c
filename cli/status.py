"""``dledger status``: per broker group and node, role, term, indexes, follower lag and last
contact, and the group's health, read from the NameServer (which nodes exist, their admin
addresses) and from each node's own ``/status``; the exit code tells the worst health."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import click

from cli.common import http_session, namesrv_get, namesrv_option, until_interrupted
from client.cluster.admin_views import group_health as group_health  # re-exported: the HEALTH_HELP rules
from client.cluster.admin_views import group_status
from dledger.log_cli import WATCH_MIN_S
from protocol.cluster_key import ClusterKeyError, load_cluster_key

NODE_TIMEOUT_S = 2.0

# health -> exit code; the worst group's code is the command's
HEALTH_EXIT = {"ok": 0, "degraded": 3, "no leader": 2, "no quorum": 2}
HEALTH_HELP = """Health of a group: "ok" (a leader, every voter answers; exit 0), "degraded"
(a leader and a majority answer, some voter does not; exit 3), "no leader" (a majority
answers but none leads, e.g. during an election; exit 2), "no quorum" (fewer than a majority of
the voters answer; exit 2). The voters and learners are the leader's membership (learners get
the log and count for nothing); without a leader, the nodes registered at the NameServer and
those the nodes name. No registered group, or no NameServer answering: exit 1."""


@click.command(epilog=HEALTH_HELP)
@namesrv_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--watch", type=click.FloatRange(min=WATCH_MIN_S), default=None, metavar="SECONDS",
              help=f"Repeat every SECONDS (at least {WATCH_MIN_S}) until Ctrl-C; the exit code is "
                   "the last round's.")
def status(namesrv: tuple[str, ...], as_json: bool, watch: float | None) -> None:
    """Per group and node: role, term, indexes, follower lag and last contact, and health."""
    if watch is None:
        rows = _read(namesrv)
        click.echo(json.dumps(rows, indent=2) if as_json else status_table(rows))
        sys.exit(exit_code(rows))
    code = [1]  # the last round's
    asyncio.run(until_interrupted(_watch(namesrv, as_json, watch, code)))
    sys.exit(code[0])


async def _watch(namesrv: Sequence[str], as_json: bool, period_s: float,
                 code: list[int]) -> None:
    """A round every ``period_s`` until cancelled (Ctrl-C): one event loop for all of them,
    so the signal cancels a round or a wait, never lands in the middle of a loop's teardown."""
    while True:  # an error is shown and the next round tries again
        try:
            rows = await _rows(namesrv)
            click.echo(json.dumps(rows, indent=2) if as_json else status_table(rows))
            code[0] = exit_code(rows)
        except click.ClickException as err:
            click.echo(f"Error: {err.format_message()}", err=True)
            code[0] = err.exit_code
        await asyncio.sleep(period_s)  # the period the user asked for


def exit_code(rows: list[dict[str, Any]]) -> int:
    codes = [HEALTH_EXIT[r["health"]] for r in rows]
    return 2 if 2 in codes else max(codes, default=0)


def _read(namesrv: Sequence[str]) -> list[dict[str, Any]]:
    return asyncio.run(_rows(namesrv))


async def _rows(namesrv: Sequence[str]) -> list[dict[str, Any]]:
    rows = await cluster_status(namesrv)
    if not rows:
        raise click.ClickException(
            f"no broker group is registered at the NameServer ({', '.join(namesrv)}): the "
            "brokers are down, not started yet, or registered elsewhere (after a NameServer "
            "restart they register again within their --register-interval-s)")
    return rows


async def cluster_status(namesrv: Sequence[str]) -> list[dict[str, Any]]:
    _, cluster = await namesrv_get(namesrv, "/v1/cluster")
    try:  # (brokers with --protect-status answer a read signed with the cluster credential)
        key = load_cluster_key(None, os.environ)
    except ClusterKeyError as err:
        raise click.ClickException(str(err)) from err
    session, scheme = http_session(NODE_TIMEOUT_S)  # brokers' admin: https with --tls-ca
    async with session:
        return list(await asyncio.gather(*(group_status(session, g, scheme=scheme,
                                                        status_key=key)
                                           for g in cluster["groups"])))


def _contact(follower: dict[str, Any]) -> str:
    ms = follower.get("last_contact_ms")
    if follower["last_contact_ticks"] == -1:  # not in the leader's term: what the group knew
        by, at_ms, ago_ms = (follower.get(k) for k in ("last_heard_by", "last_heard_ms",
                                                       "last_heard_ago_ms"))
        if not (isinstance(by, str) and isinstance(at_ms, int) and isinstance(ago_ms, int)):
            return "never"
        when = f"{time.strftime('%H:%M:%S', time.localtime(at_ms / 1000))}, {_ago(ago_ms)} ago"
        if follower.get("reachable") is False:
            return f"unreachable since {when} (as last seen by {by})"
        return f"not heard this term (last seen {when}, by {by})"
    return f"{ms} ms" if isinstance(ms, int) else f"{follower['last_contact_ticks']} ticks"


def _ago(ms: int) -> str:
    s = ms // 1000
    if s < 120:
        return f"{s} s"
    return f"{s // 60} min" if s < 7200 else f"{s // 3600} h"


def status_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'group':<6} {'node':<5} {'role':<12} {'term':>5} {'last':>8} {'commit':>8} "
             f"{'applied':>8}  followers (lag / last contact)"]
    for g in rows:
        for n in g["nodes"]:
            if n["role"] == "unreachable":
                lines.append(f"{g['group']:<6} {n['node']:<5} unreachable  ({n['error']})")
                continue
            fol = ", ".join(f"{k}: {v['lag']} / {_contact(v)}" for k, v in n["followers"].items())
            lines.append(f"{g['group']:<6} {n['node']:<5} {n['role']:<12} {n['term']:>5} "
                         f"{n['last_index']:>8} {n['commit_index']:>8} {n['applied_index']:>8}  {fol}")
        change = "; a membership change in progress" if g.get("change_in_progress") else ""
        learners = f"; learners {', '.join(g['learners'])}" if g.get("learners") else ""
        lines.append(f"{g['group']:<6} health: {g['health']} (voters {', '.join(g['voters'])}"
                     f"{learners}{change})")
    return "\n".join(lines)
