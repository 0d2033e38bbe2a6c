"""``dledger consumer reset-offset`` and ``dledger consumer status``: a consumer group's offsets
set to a time on every queue of a topic (RocketMQ's ``mqadmin resetOffsetByTime``), and a
group's live members, their subscriptions and its per-queue progress, through the brokers'
OFFSET_RESET and CONSUMER_STATUS requests (``broker.features.admin.handlers``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import click

from cli.common import groups_of, iso_ms, namesrv_option, with_routes
from client.cluster.admin_views import consumer_views, summarize_consumers
from client.cluster.routes import Routes
from protocol import broker_kinds as bp
from protocol.broker_kinds import RESET_EARLIEST_MS, RESET_LATEST_MS

NODE_TIMEOUT_S = 3.0
SUBSCRIPTIONS_DIFFER = ("the members subscribe differently: each is given queues of topics or "
                        "tags it does not read, and their messages are not consumed; give every "
                        "member of the group the same subscriptions")


def _reset_target(to_timestamp: str | None, to_earliest: bool, to_latest: bool) -> tuple[int, str]:
    given = [n for n, v in (("--to-timestamp", to_timestamp is not None),
                            ("--to-earliest", to_earliest), ("--to-latest", to_latest)) if v]
    if len(given) != 1:
        raise click.UsageError("give one of --to-timestamp ISO, --to-earliest, --to-latest"
                               + (f" (not {' and '.join(given)})" if given else ""))
    if to_earliest:
        return RESET_EARLIEST_MS, "the earliest message"
    if to_latest:
        return RESET_LATEST_MS, "the end (past the last message)"
    assert to_timestamp is not None
    ms = max(0, iso_ms(to_timestamp, "--to-timestamp"))
    return ms, f"{to_timestamp} ({ms} ms)"


@click.command("reset-offset", epilog="""Push and lite pull consumers keep their progress in
memory and commit it every few seconds: a member that is running would overwrite the reset. So
the reset is refused while live members of GROUP (as their heartbeats tell the groups' leaders)
subscribe to TOPIC; --force resets all the same (those members will then overwrite it with
their own progress, unless they are stopped before their next commit). A consumer that assigns
itself queues sends no heartbeats: stop it first.""")
@namesrv_option
@click.argument("group")
@click.argument("topic_name", metavar="TOPIC")
@click.option("--to-timestamp", metavar="ISO",
              help="The first message stored at or after this time (ISO 8601; local time if no "
                   "offset is given), e.g. 2024-05-01T12:00:00 or 2024-05-01T10:00:00+00:00.")
@click.option("--to-earliest", is_flag=True, help="The first message each queue still holds.")
@click.option("--to-latest", is_flag=True, help="Past the last message: only new ones.")
@click.option("--force", is_flag=True, help="Reset even while live members consume TOPIC "
                                            "(they will overwrite it: see below).")
def reset_offset(namesrv: tuple[str, ...], group: str, topic_name: str,
                 to_timestamp: str | None, to_earliest: bool, to_latest: bool,
                 force: bool) -> None:
    """Set GROUP's offset on every queue of TOPIC, in every broker group serving it, to the
    first message stored at or after a time (one entry per broker group: all its queues at
    once). Prints each queue's offset before -> after."""
    timestamp_ms, said = _reset_target(to_timestamp, to_earliest, to_latest)

    async def reset(routes: Routes) -> None:
        route = await routes.route(topic_name, refresh=True)
        if not route.exists or not route.groups:
            raise click.ClickException(f"no broker group serves topic {topic_name!r}")
        if not force:  # refuse before any group resets, rather than halfway through
            for g in route.groups:
                _, st = await routes.call_group_leader(g, bp.CONSUMER_STATUS, group,
                                                       timeout_s=NODE_TIMEOUT_S)
                live = [m["client_id"] for m in st["members"]
                        if topic_name in m["subscriptions"]]
                if live:
                    raise click.ClickException(
                        f"consumer group {group!r} has {len(live)} live member(s) on "
                        f"{topic_name} ({', '.join(live)}, seen by group {g.group}'s leader): "
                        f"they would overwrite the reset. Stop them first, or use --force.")
        click.echo(f"resetting {group}'s offsets on {topic_name} to {said}")
        for g in sorted(route.groups, key=lambda g: g.group):
            _, rows = await routes.call_group_leader(
                g, bp.OFFSET_RESET, group, topic_name, timestamp_ms, force,
                timeout_s=NODE_TIMEOUT_S)
            for qid, old, new in rows:
                click.echo(f"{g.group + '/' + str(qid):<12} {_offset(old):>10} -> {new}")
        if force:
            click.echo("(--force: members still running will overwrite these with their own "
                       "progress at their next commit)")
    with_routes(namesrv, reset)


def _offset(n: int) -> str:
    return "none" if n < 0 else str(n)


@click.command("status")
@namesrv_option
@click.argument("group")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def consumer_status(namesrv: tuple[str, ...], group: str, as_json: bool) -> None:
    """GROUP's live members (client id, model, subscriptions with their tag or SQL expressions,
    as their heartbeats told the brokers, and which nodes see them; a warning when members
    subscribe differently), then per queue of each topic it subscribes to or has committed on:
    committed offset, max offset and lag."""
    async def show(routes: Routes) -> None:
        views = await asyncio.gather(*(consumer_views(routes, g, group, NODE_TIMEOUT_S)
                                       for g in await groups_of(routes, ())))
        report = summarize_consumers(group, [v for vs in views for v in vs])
        click.echo(json.dumps(report, indent=2) if as_json else status_text(report))
    with_routes(namesrv, show)


def status_text(report: dict[str, Any]) -> str:
    members = report["members"]
    lines = [f"consumer group {report['group']}: {len(members)} live member(s)"]
    if members:
        lines.append(f"  {'client id':<24} {'model':<12} {'seen by':<24} subscriptions")
        for m in members:
            subs = "; ".join(f"{t}: {e}" for t, e in sorted(m["subscriptions"].items()))
            lines.append(f"  {m['client_id']:<24} {m['model']:<12} "
                         f"{' '.join(m['seen_by']):<24} {subs}")
    if report["subscription_conflict"]:
        lines.append(f"  WARNING: {SUBSCRIPTIONS_DIFFER} ({report['subscription_conflict']})")
    if report["queues"]:
        lines.append(f"  {'topic':<24} {'queue':<10} {'committed':>10} {'max':>10} {'lag':>8}")
        for r in report["queues"]:
            note = "" if r["from_leader"] else "  (no leader answered: a follower's view)"
            lines.append(f"  {r['topic']:<24} {r['queue']:<10} {_offset(r['committed']):>10} "
                         f"{r['max']:>10} {r['lag']:>8}{note}")
        lines.append(f"  total lag: {report['total_lag']}")
    else:
        lines.append("  no topic subscribed or committed on")
    for u in report["unreachable"]:
        lines.append(f"  {u['node']}: no answer ({u['error']})")
    return "\n".join(lines)
