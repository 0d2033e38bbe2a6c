"""``dledger leader transfer`` and ``dledger consumer progress``: a group's leadership and a
consumer group's progress, through the groups' leaders."""

from __future__ import annotations

import click

from cli.common import groups_of, namesrv_option, run, with_routes
from client import PullConsumer
from client.cluster.routes import Routes
from protocol import broker_kinds as bp

TRANSFER_TIMEOUT_S = 10.0


@click.group()
def leader() -> None:
    """Leadership of broker groups."""


@leader.command("transfer")
@namesrv_option
@click.argument("group")
@click.argument("to")
def leader_transfer(namesrv: tuple[str, ...], group: str, to: str) -> None:
    """Hand GROUP's leadership to node TO (it is caught up first)."""
    async def transfer(routes: Routes) -> None:
        for g in await groups_of(routes, (group,)):
            if to not in g.nodes:  # named here: the broker's answer would be a bare ValueError
                raise click.ClickException(f"group {g.group} has no registered node {to!r} "
                                           f"(registered: {', '.join(sorted(g.nodes))})")
            node, _ = await routes.call_group_leader(g, bp.TRANSFER_LEADERSHIP, to,
                                                     timeout_s=TRANSFER_TIMEOUT_S)
            if node == to:  # (the leader answered a transfer to itself: nothing moved)
                click.echo(f"group {g.group}: {to} already leads, nothing to move")
            else:
                click.echo(f"group {g.group}: leadership moved from {node} to {to}")
    with_routes(namesrv, transfer)


@click.group()
def consumer() -> None:
    """Consumer group commands."""


@consumer.command("progress")
@namesrv_option
@click.argument("group")
@click.argument("topic_name")
def consumer_progress(namesrv: tuple[str, ...], group: str, topic_name: str) -> None:
    """Per queue: the broker's max offset, GROUP's committed offset, and the difference."""
    async def show() -> None:
        async with PullConsumer(list(namesrv), group) as c:
            click.echo(f"{'queue':<12} {'max':>8} {'committed':>10} {'lag':>8}")
            for mq in await c.fetch_queues(topic_name):
                hi = (await c.pull(mq, 0, 0)).max_offset
                done = await c.committed(mq)
                click.echo(f"{mq.group + '/' + str(mq.queue_id):<12} {hi:>8} {done:>10} "
                           f"{hi - max(done, 0):>8}")
    run(show())
