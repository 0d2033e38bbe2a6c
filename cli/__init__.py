"""The ``dledger`` command (click), one module per area: ``up`` (a NameServer and broker groups
in the foreground) and ``node`` (its nodes, through its control file), ``status``, ``topic``,
``send`` and ``consume`` (``messages``), ``leader`` and ``consumer`` (``admin``; its
``reset-offset`` and ``status`` in ``consumers.admin``, ``running-info`` and
``consume-directly`` in ``consumers.ask``, ``retry-policy`` in ``consumers.retry_policy``),
``producer``, ``dlq`` (and ``consumer retry``: ``consumers.dlq``), ``acl`` (access control's
accounts), ``bench``, ``tls`` (a test CA), ``message`` (``query``: show and query stored
messages; ``message trace`` in ``trace``);
``dledger log ...`` for a bare replicated-log group lives with the log (``dledger.log_cli``),
``dledger chaos ...`` with the chaos harness. The servers' own commands are ``dledger-broker``
and ``dledger-namesrv``. ``main`` is the console script's entry point."""

from __future__ import annotations

import click

from cli.acl import acl, credentials_options
from cli.admin import consumer, leader
from cli.bench import bench
from cli.consumers.admin import consumer_status, reset_offset
from cli.consumers.ask import consume_directly, running_info
from cli.consumers.dlq import consumer_retry, dlq
from cli.consumers.retry_policy import retry_policy
from cli.group import group
from cli.messages import consume, send
from cli.node import node
from cli.producer import producer
from cli.query import message
from cli.secrets import secret_option_value
from cli.status import status
from cli.tls import tls
from cli.topic import topic
from cli.trace import message_trace
from cli.up import up
from dledger import log_cli
from protocol.auth import ACCESS_KEY_ENV, SECRET_KEY_ENV


@click.group()
@click.option("--access-key", envvar=ACCESS_KEY_ENV, default=None, metavar="KEY",
              help=f"Sign requests as this account (a cluster with access control; default "
                   f"${ACCESS_KEY_ENV}).")
@click.option("--secret-key", envvar=SECRET_KEY_ENV, default=None, metavar="SECRET",
              help=f"The account's secret: from ${SECRET_KEY_ENV} only (on the command line it "
                   f"is refused: other users of the machine can read a command line).")
@click.option("--secret-key-file", default=None, type=click.Path(dir_okay=False),
              help="A file (mode 0600) whose first line is the account's secret.")
@click.pass_context
def main(ctx: click.Context, access_key: str | None, secret_key: str | None,
         secret_key_file: str | None) -> None:
    """dledger: a message broker cluster on Raft-replicated commitlogs."""
    credentials_options(access_key, secret_option_value(ctx, "secret_key", secret_key,
                                                        secret_key_file, SECRET_KEY_ENV))


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
              add_help_option=False)
@click.pass_context
def chaos(ctx: click.Context) -> None:
    """Live chaos scenarios on real processes: dledger chaos run --help (needs the dev extra)."""
    try:  # loaded on use: the harness needs the dev extra (toxiproxy-python, matplotlib)
        from chaos.live.command import chaos as chaos_group
    except ImportError as err:
        raise click.ClickException(f"dledger chaos needs the dev extra "
                                   f"(pip install -e '.[dev]'): {err}") from err
    chaos_group.main(args=ctx.args, prog_name="dledger chaos")


consumer.add_command(consumer_retry)
consumer.add_command(reset_offset)
consumer.add_command(consumer_status)
consumer.add_command(running_info)
consumer.add_command(consume_directly)
consumer.add_command(retry_policy)
for command in (up, node, status, topic, send, consume, leader, consumer, producer, dlq, bench,
                group, acl, tls):
    main.add_command(command)
message.add_command(message_trace)
main.add_command(message)
main.add_command(log_cli.main, name="log")

__all__ = ["main"]
