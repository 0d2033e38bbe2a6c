"""``dledger topic create|update|delete|list|route|status``: topic configuration, through each
group's leader (TOPIC_PUT / TOPIC_DELETE are replicated entries), and what the NameServer and
the queues say about a topic. ``list`` reads the topics as the web console does
(``client.cluster.admin_views.topic_rows``) and each group leader's status for the consumer
groups of each topic."""

from __future__ import annotations

import json
from urllib.parse import quote

import click

from cli.common import describe, groups_of, namesrv_get, namesrv_option, run, with_routes
from client import PullConsumer
from client.cluster.admin_views import topic_rows
from client.cluster.routes import Routes
from protocol import broker_kinds as bp
from protocol.errors import DLedgerError
from protocol.topics import DEFAULT_QUEUES, PERM_RW

QUEUES = click.IntRange(0, 1024)
PERM = click.Choice(["2", "4", "6"])
PERM_HELP = "2 write only, 4 read only, 6 read and write."
GROUPS_HELP = "Only these broker groups (repeatable; default: all)."
# what ``topic create`` gives a topic unless told otherwise (``topic update`` of a group
# without the topic creates it with these for what it is not told)
CREATE_DEFAULTS = {"read_queues": DEFAULT_QUEUES, "write_queues": DEFAULT_QUEUES, "perm": PERM_RW}


@click.group()
def topic() -> None:
    """Create, update, delete, list and route topics."""


@topic.command("create")
@namesrv_option
@click.option("--queues", type=click.IntRange(1, 1024), default=DEFAULT_QUEUES, show_default=True,
              help="Read and write queues per group.")
@click.option("--perm", type=PERM, default=str(PERM_RW), show_default=True, help=PERM_HELP)
@click.option("--group", "groups", multiple=True, help=GROUPS_HELP)
@click.argument("name")
def topic_create(namesrv: tuple[str, ...], queues: int, perm: str, groups: tuple[str, ...],
                 name: str) -> None:
    """Create (or overwrite) topic NAME on every broker group (cluster mode) or the given ones."""
    async def put(routes: Routes) -> None:
        for g in await groups_of(routes, groups):
            _, st = await routes.call_group_leader(g, bp.TOPIC_PUT, name, queues, queues,
                                                   int(perm))
            click.echo(f"group {g.group}: {st}")
    with_routes(namesrv, put)


@topic.command("update")
@namesrv_option
@click.option("--queues", type=QUEUES, default=None, help="Read and write queues per group.")
@click.option("--read-queues", type=QUEUES, default=None, help="Read queues (overrides --queues).")
@click.option("--write-queues", type=QUEUES, default=None,
              help="Write queues (overrides --queues).")
@click.option("--perm", type=PERM, default=None, help=PERM_HELP)
@click.option("--group", "groups", multiple=True, help=GROUPS_HELP)
@click.argument("name")
def topic_update(namesrv: tuple[str, ...], queues: int | None, read_queues: int | None,
                 write_queues: int | None, perm: str | None, groups: tuple[str, ...],
                 name: str) -> None:
    """Change topic NAME's queue counts or permission; what is not given stays as it is on each
    group. A group without the topic gets it, with what is given and create's defaults for the
    rest (RocketMQ's updateTopic creates too): each line says created or updated."""
    change = {k: v for k, v in (("read_queues", queues if read_queues is None else read_queues),
                                ("write_queues", queues if write_queues is None else write_queues),
                                ("perm", None if perm is None else int(perm))) if v is not None}
    if not change:
        raise click.UsageError("nothing to change: give --queues, --read-queues, --write-queues "
                               "or --perm")

    async def put(routes: Routes) -> None:
        for g in await groups_of(routes, groups):
            _, st = await routes.call_group_leader(g, bp.BROKER_STATUS)
            current = st["topics"].get(name)
            done = "updated" if current is not None else "created"
            new = {**(current or CREATE_DEFAULTS), **change}
            _, res = await routes.call_group_leader(g, bp.TOPIC_PUT, name, new["read_queues"],
                                                    new["write_queues"], new["perm"])
            click.echo(f"group {g.group}: {done if res == 'OK' else res} (read queues "
                       f"{new['read_queues']}, write queues {new['write_queues']}, "
                       f"perm {new['perm']})")
    with_routes(namesrv, put)


@topic.command("delete")
@namesrv_option
@click.argument("name")
def topic_delete(namesrv: tuple[str, ...], name: str) -> None:
    """Delete topic NAME on every broker group that has it."""
    async def delete(routes: Routes) -> None:
        found = False
        for g in await groups_of(routes, ()):
            _, st = await routes.call_group_leader(g, bp.BROKER_STATUS)
            if name not in st["topics"]:
                click.echo(f"group {g.group}: no topic {name!r}")
                continue
            _, res = await routes.call_group_leader(g, bp.TOPIC_DELETE, name)
            click.echo(f"group {g.group}: {res}")
            found = True
        if not found:
            raise click.ClickException(f"no group has a topic {name!r}")
    with_routes(namesrv, delete)


@topic.command("list")
@namesrv_option
@click.option("--all", "show_all", is_flag=True,
              help="System topics too (retry, dead-letter, trace, schedule, ...).")
@click.option("--json", "as_json", is_flag=True, help="As JSON.")
def topic_list(namesrv: tuple[str, ...], show_all: bool, as_json: bool) -> None:
    """The topics the NameServer knows: per topic, the broker groups serving it (read and write
    queues, perm) and the consumer groups that consume it (a live member subscribes to it, or
    the group committed an offset on it). System topics are hidden unless --all."""
    _, cluster = run(namesrv_get(namesrv, "/v1/cluster"))
    rows = [r for r in topic_rows(cluster["groups"]) if show_all or not r["system"]]
    unanswered: list[str] = []

    async def consumers(routes: Routes) -> None:
        by_group: dict[str, dict[str, list[str]]] = {}
        for g in await routes.cluster_groups():
            try:
                _, st = await routes.call_group_leader(g, bp.BROKER_STATUS)
                by_group[g.group] = st.get("topic_consumer_groups") or {}
            except DLedgerError as err:
                unanswered.append(f"group {g.group}: {describe(err)}")
        for r in rows:
            r["consumer_groups"] = sorted({c for g in r["groups"]
                                           for c in by_group.get(g, {}).get(r["topic"], ())})
    if rows:
        with_routes(namesrv, consumers)
    for line in unanswered:
        click.echo(f"consumer groups not known for {line}", err=True)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no topic" + ("" if show_all else " (system topics are hidden: --all)"))
        return
    served = [", ".join(f"{g} (queues {c['read_queues']}/{c['write_queues']}, perm {c['perm']})"
                        for g, c in sorted(r["groups"].items())) for r in rows]
    width = max(len("topic"), *(len(r["topic"]) for r in rows))
    served_width = max(len("broker groups"), *(len(s) for s in served))
    click.echo(f"{'topic':<{width}}  {'broker groups':<{served_width}}  consumer groups")
    for r, where in zip(rows, served):
        click.echo(f"{r['topic']:<{width}}  {where:<{served_width}}  "
                   f"{', '.join(r['consumer_groups']) or '-'}")


@topic.command("route")
@namesrv_option
@click.argument("name")
def topic_route(namesrv: tuple[str, ...], name: str) -> None:
    """Which groups serve topic NAME, with their nodes, leader and queues (JSON)."""
    status, body = run(namesrv_get(namesrv, f"/v1/topics/{quote(name, safe='')}/route"))
    if status == 404:
        raise click.ClickException(f"no group serves topic {name!r}")
    click.echo(json.dumps(body, indent=2))


@topic.command("status")
@namesrv_option
@click.argument("name")
def topic_status(namesrv: tuple[str, ...], name: str) -> None:
    """Per group and queue: min and max offset of topic NAME."""
    async def show() -> None:
        async with PullConsumer(list(namesrv), "dledger-cli") as c:
            click.echo(f"{'queue':<12} {'min':>8} {'max':>8}")
            for mq in await c.fetch_queues(name):
                r = await c.pull(mq, 0, 0)
                click.echo(f"{mq.group + '/' + str(mq.queue_id):<12} {r.min_offset:>8} "
                           f"{r.max_offset:>8}")
    run(show())
