"""``dledger consumer running-info`` and ``dledger consumer consume-directly``: one live consumer
asked, through a broker node it is connected to, for its own account of itself (RocketMQ's
``mqadmin consumerStatus``) or to consume one stored message once more (``mqadmin
consumeMessage``: re-consume one message by one consumer, its offsets untouched)
(``client.cluster.ask_consumer``)."""

from __future__ import annotations

import json

import click

from cli.common import namesrv_option, with_routes
from client.cluster import ask_consumer
from client.cluster.routes import Routes

CLIENT_HELP = "CLIENT_ID is the consumer's client id, as `dledger consumer status GROUP` lists it."


@click.command("running-info", epilog=CLIENT_HELP)
@namesrv_option
@click.argument("group")
@click.argument("client_id")
def running_info(namesrv: tuple[str, ...], group: str, client_id: str) -> None:
    """What consumer CLIENT_ID of GROUP says of itself, as JSON: its properties, subscriptions
    and per-queue progress (RocketMQ's GET_CONSUMER_RUNNING_INFO; RocketMQ 4.x clients)."""
    async def ask(routes: Routes) -> None:
        info = await ask_consumer.running_info(routes, group, client_id)
        click.echo(json.dumps(info, indent=2, sort_keys=True))
    with_routes(namesrv, ask)


@click.command("consume-directly", epilog=CLIENT_HELP + " OFFSET_MSG_ID is the message's offset "
               "msg id (as `dledger send` and `dledger message query` print it).")
@namesrv_option
@click.argument("group")
@click.argument("client_id")
@click.argument("offset_msg_id")
def consume_directly(namesrv: tuple[str, ...], group: str, client_id: str,
                     offset_msg_id: str) -> None:
    """Consumer CLIENT_ID of GROUP consumes the stored message OFFSET_MSG_ID once more, outside
    its queues: no offset moves, and a failure sends nothing to the retry topic (RocketMQ's
    CONSUME_MESSAGE_DIRECTLY; RocketMQ 4.x clients that implement it). Prints its result
    (CR_SUCCESS, CR_LATER, ...) and how long it took; exits 1 unless it was CR_SUCCESS."""
    async def ask(routes: Routes) -> None:
        try:
            result = await ask_consumer.consume_directly(routes, group, client_id, offset_msg_id)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="OFFSET_MSG_ID") from None
        outcome = str(result.get("consumeResult", "?"))
        click.echo(f"{client_id} ({group}, via {result['node']}): {outcome} in "
                   f"{result.get('spentTimeMills', '?')} ms"
                   + (f": {result['remark']}" if result.get("remark") else ""))
        if outcome != "CR_SUCCESS":
            raise SystemExit(1)
    with_routes(namesrv, ask)
