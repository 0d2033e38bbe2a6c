"""``dledger topic create|update|delete|list|route|status``: topic configuration, through each
group's leader (TOPIC_PUT / TOPIC_DELETE are replicated entries), and what the NameServer and
the queues say about a topic."""

from __future__ import annotations

import json
from urllib.parse import quote

import click

from cli.common import groups_of, namesrv_get, namesrv_option, run, with_routes
from client import PullConsumer
from client.cluster.routes import Routes
from protocol import broker_kinds as bp

QUEUES = click.IntRange(0, 1024)
PERM = click.Choice(["2", "4", "6"])
PERM_HELP = "2 write only, 4 read only, 6 read and write."
GROUPS_HELP = "Only these broker groups (repeatable; default: all)."


@click.group()
def topic() -> None:
    """Create, update, delete, list and route topics."""


@topic.command("create")
@namesrv_option
@click.option("--queues", type=click.IntRange(1, 1024), default=4, show_default=True,
              help="Read and write queues per group.")
@click.option("--perm", type=PERM, default="6", show_default=True, help=PERM_HELP)
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
    """Change existing topic NAME's queue counts or permission; what is not given stays as it is
    on each group."""
    change = {k: v for k, v in (("read_queues", queues if read_queues is None else read_queues),
                                ("write_queues", queues if write_queues is None else write_queues),
                                ("perm", None if perm is None else int(perm))) if v is not None}
    if not change:
        raise click.UsageError("nothing to change: give --queues, --read-queues, --write-queues "
                               "or --perm")

    async def put(routes: Routes) -> None:
        for g in await groups_of(routes, groups):
            client = routes.group_client(g)
            _, st = await client.call_leader(bp.BROKER_STATUS)
            current = st["topics"].get(name)
            if current is None:
                raise click.ClickException(f"group {g.group} has no topic {name!r} "
                                           f"(dledger topic create makes one)")
            new = {**current, **change}
            _, res = await client.call_leader(bp.TOPIC_PUT, name, new["read_queues"],
                                              new["write_queues"], new["perm"])
            click.echo(f"group {g.group}: {res} (read queues {new['read_queues']}, write queues "
                       f"{new['write_queues']}, perm {new['perm']})")
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
def topic_list(namesrv: tuple[str, ...]) -> None:
    """Topics known to the NameServer."""
    _, body = run(namesrv_get(namesrv, "/v1/topics"))
    for t in body["topics"]:
        click.echo(t)


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
