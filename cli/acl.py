"""``dledger acl put|delete|list``: the accounts of access control, on every broker group (each
group's ACL is its own log's: a command goes to each group's leader), and the ``--access-key`` /
``--secret-key`` options the ``dledger`` command takes for itself.

Credentials come from the options or the environment (DLEDGER_ACCESS_KEY, DLEDGER_SECRET_KEY);
the options are put in the environment of this process, where the client library reads them
(``client.cluster.routes``). A new account's secret comes from DLEDGER_ACL_NEW_SECRET or
``--new-secret-file``; a secret typed on the command line, which other users of the machine
can read, is refused (``cli.secrets``). Nothing prints a secret.
"""

from __future__ import annotations

import json
import os
from typing import Any

import click

from broker.features.acl.model import Account, parse_perm
from cli.common import groups_of, namesrv_option, with_routes
from cli.secrets import secret_option_value
from client.cluster.routes import Routes
from protocol import broker_kinds as bp
from protocol.auth import ACCESS_KEY_ENV, SECRET_KEY_ENV

ACL_TIMEOUT_S = 10.0
NEW_SECRET_ENV = "DLEDGER_ACL_NEW_SECRET"


def credentials_options(access_key: str | None, secret_key: str | None) -> None:
    """The ``dledger`` group's --access-key and --secret-key: into this process's environment."""
    if access_key:
        os.environ[ACCESS_KEY_ENV] = access_key
    if secret_key:
        os.environ[SECRET_KEY_ENV] = secret_key


def _perms(values: tuple[str, ...], what: str) -> tuple[tuple[str, int], ...]:
    out: dict[str, int] = {}
    for v in values:
        name, sep, perm = v.rpartition("=")
        if not sep or not name:
            raise click.BadParameter(f"expected NAME=PERM, got {v!r}", param_hint=f"'--{what}'")
        try:
            out[name] = parse_perm(perm)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint=f"'--{what}'") from err
    return tuple(sorted(out.items()))


@click.group()
def acl() -> None:
    """Access control: accounts, their secrets and permissions (brokers started with --acl)."""


@acl.command("put")
@namesrv_option
@click.argument("access_key")
@click.option("--new-secret", envvar=NEW_SECRET_ENV, default=None,
              help=f"The account's secret (8-256 characters): from ${NEW_SECRET_ENV} only (on "
                   f"the command line it is refused: others can read a command line).")
@click.option("--new-secret-file", default=None, type=click.Path(dir_okay=False),
              help="A file (mode 0600) whose first line is the account's secret.")
@click.option("--admin", is_flag=True, help="May do anything, admin operations included.")
@click.option("--default-topic-perm", default="DENY", show_default=True,
              help="For topics not named by --topic: DENY, PUB, SUB or PUB|SUB.")
@click.option("--default-group-perm", default="DENY", show_default=True,
              help="For groups not named by --group (consumer groups need SUB, producer groups "
                   "of transactions PUB).")
@click.option("--topic", "topics", multiple=True, metavar="TOPIC=PERM", help="Repeatable.")
@click.option("--group", "groups", multiple=True, metavar="GROUP=PERM", help="Repeatable.")
@click.option("--broker-group", "broker_groups", multiple=True,
              help="Only these broker groups (default: every registered one).")
@click.pass_context
def acl_put(ctx: click.Context, namesrv: tuple[str, ...], access_key: str,
            new_secret: str | None, new_secret_file: str | None, admin: bool,
            default_topic_perm: str, default_group_perm: str, topics: tuple[str, ...],
            groups: tuple[str, ...], broker_groups: tuple[str, ...]) -> None:
    """Add the account ACCESS_KEY, or replace it (its permissions are exactly those given)."""
    new_secret = secret_option_value(ctx, "new_secret", new_secret, new_secret_file,
                                     NEW_SECRET_ENV)
    if new_secret is None:
        raise click.UsageError(f"the new account's secret: put it in ${NEW_SECRET_ENV}, or give "
                               "--new-secret-file FILE")
    try:
        account = Account(access_key, new_secret, admin, parse_perm(default_topic_perm),
                          parse_perm(default_group_perm), _perms(topics, "topic"),
                          _perms(groups, "group"))
    except ValueError as err:
        raise click.UsageError(str(err)) from err

    async def put(routes: Routes) -> None:
        for g in await groups_of(routes, broker_groups):
            node, status = await routes.call_group_leader(
                g, bp.ACL_PUT, account.row(), timeout_s=ACL_TIMEOUT_S)
            click.echo(f"group {g.group}: account {access_key} {status} (leader {node})")
    with_routes(namesrv, put)


@acl.command("delete")
@namesrv_option
@click.argument("access_key")
@click.option("--broker-group", "broker_groups", multiple=True)
def acl_delete(namesrv: tuple[str, ...], access_key: str, broker_groups: tuple[str, ...]) -> None:
    """Delete the account ACCESS_KEY."""
    async def delete(routes: Routes) -> None:
        for g in await groups_of(routes, broker_groups):
            node, _status = await routes.call_group_leader(
                g, bp.ACL_DELETE, access_key, timeout_s=ACL_TIMEOUT_S)
            click.echo(f"group {g.group}: account {access_key} deleted (leader {node})")
    with_routes(namesrv, delete)


@acl.command("list")
@namesrv_option
@click.argument("access_key", required=False, default="")
@click.option("--json", "as_json", is_flag=True)
@click.option("--broker-group", "broker_groups", multiple=True)
def acl_list(namesrv: tuple[str, ...], access_key: str, as_json: bool,
             broker_groups: tuple[str, ...]) -> None:
    """The accounts (no secrets), as each group's leader knows them."""
    async def show(routes: Routes) -> None:
        report: dict[str, Any] = {}
        for g in await groups_of(routes, broker_groups):
            _, accounts = await routes.call_group_leader(
                g, bp.ACL_LIST, access_key, timeout_s=ACL_TIMEOUT_S)
            report[g.group] = accounts
        if as_json:
            click.echo(json.dumps(report, indent=2, sort_keys=True))
            return
        for group, accounts in report.items():
            click.echo(f"group {group}: {len(accounts)} account(s)")
            for a in accounts:
                perms = " ".join([f"topic:{n}={p}" for n, p in a["topic_perms"].items()]
                                 + [f"group:{n}={p}" for n, p in a["group_perms"].items()])
                kind = "admin" if a["admin"] else "user"
                boot = " (bootstrap)" if a["bootstrap"] else ""
                click.echo(f"  {a['access_key']:<20} {kind}{boot}  default topic "
                           f"{a['default_topic_perm']}, group {a['default_group_perm']}  {perms}")
    with_routes(namesrv, show)


__all__ = ["acl", "credentials_options"]
