"""``dledger consumer retry-policy``: a consumer group's retry policy, as each broker group keeps it
(RocketMQ's subscription group config, ``mqadmin updateSubGroup``'s retry times): the most times
a message is delivered to the group's RocketMQ 5 consumers before it goes to ``%DLQ%<group>``.
Through the brokers' SUBSCRIPTION_GROUP_PUT and _GET requests
(``broker.features.admin.handlers``), to every broker group's leader (or those named).

    dledger consumer retry-policy GROUP                              # show it
    dledger consumer retry-policy GROUP --max-delivery-attempts 5    # set it
    dledger consumer retry-policy GROUP --default                    # the broker's default again
    dledger consumer retry-policy                                    # every group with one
"""

from __future__ import annotations

import json
from typing import Any

import click

from cli.common import groups_of, namesrv_option, with_routes
from client.cluster.routes import Routes
from protocol import broker_kinds as bp
from protocol.consume_rules import MAX_RECONSUME_TIMES_LIMIT

NODE_TIMEOUT_S = 5.0


def policy_lines(broker_group: str, group: str, view: dict[str, Any]) -> list[str]:
    """One line per consumer group of a broker group's answer (or the default's, if ``group``
    has no setting there)."""
    default = view["default_max_delivery_attempts"]
    rows = view["groups"]
    if group and not rows:
        return [f"{broker_group}: {group}: max delivery attempts {default} (the broker's default)"]
    if not rows:
        return [f"{broker_group}: no consumer group has a setting (the broker's default: "
                f"{default})"]
    return [f"{broker_group}: {r['group']}: max delivery attempts {r['max_delivery_attempts']}"
            for r in rows]


@click.command("retry-policy", epilog="""Each broker group keeps its own copy (replicated through
its log, so it survives a leader change); a setting is made on every broker group registered
(or those --broker-group names), one after the other. RocketMQ 5 clients receive it in their
settings (backoff_policy.max_attempts) when their session starts; a receive uses it at once.""")
@namesrv_option
@click.argument("group", required=False, default="")
@click.option("--max-delivery-attempts", "attempts",
              type=click.IntRange(1, MAX_RECONSUME_TIMES_LIMIT), default=None,
              help="Set it: deliveries of a message before it goes to %DLQ%<GROUP> "
                   "(RocketMQ's retryMaxTimes + 1).")
@click.option("--default", "to_default", is_flag=True,
              help="Clear the setting: the broker's --grpc-max-delivery-attempts again.")
@click.option("--broker-group", "broker_groups", multiple=True, metavar="NAME",
              help="Only this broker group (repeatable; default: every one registered).")
@click.option("--json", "as_json", is_flag=True, help="Print each broker group's answer as JSON.")
def retry_policy(namesrv: tuple[str, ...], group: str, attempts: int | None, to_default: bool,
                 broker_groups: tuple[str, ...], as_json: bool) -> None:
    """Show or set consumer GROUP's maximum delivery attempts (without GROUP: every group's
    that has one)."""
    changing = attempts is not None or to_default
    if attempts is not None and to_default:
        raise click.UsageError("give --max-delivery-attempts N or --default, not both")
    if changing and not group:
        raise click.UsageError("name the consumer GROUP whose retry policy to set")

    async def go(routes: Routes) -> None:
        answers = {}
        for g in await groups_of(routes, broker_groups):
            if changing:
                _, view = await routes.call_group_leader(
                    g, bp.SUBSCRIPTION_GROUP_PUT, group, attempts, timeout_s=NODE_TIMEOUT_S)
            else:
                _, view = await routes.call_group_leader(
                    g, bp.SUBSCRIPTION_GROUP_GET, group, timeout_s=NODE_TIMEOUT_S)
            answers[g.group] = view
            if not as_json:
                for line in policy_lines(g.group, group, view):
                    click.echo(line)
        if as_json:
            click.echo(json.dumps(answers, indent=2, sort_keys=True))
    with_routes(namesrv, go)
