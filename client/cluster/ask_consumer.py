"""An operator's questions to one live consumer, asked through the broker nodes it is connected
to (RocketMQ's ``mqadmin consumerStatus`` and ``consumeMessage``): its running information
(``running_info``) and consuming one stored message once more (``consume_directly``), the
broker passing the question on the consumer's own connection (``broker.features.clients``).

A consumer heartbeats on several nodes; each node of the groups asked is tried at once and the
first answer counts. A node it is not connected to answers CLIENT_NOT_CONNECTED; if every node
does, that is the error (``errors.ClientNotConnectedError``). Shared by ``dledger consumer``
and the NameServer's console.
"""

from __future__ import annotations

import asyncio
from typing import Any

from client import errors
from client.cluster.routes import GroupRoute, Routes, client_error
from protocol import broker_kinds as bp
from protocol.errors import DLedgerError

__all__ = ["consume_directly", "running_info"]

ASK_TIMEOUT_S = 15.0  # the broker's own bound on the consumer (10 s) and the way there and back


async def running_info(routes: Routes, group: str, client_id: str) -> dict[str, Any]:
    """What consumer ``client_id`` of ``group`` says of itself (RocketMQ's ConsumerRunningInfo:
    its properties, subscriptions and per-queue progress), with ``node`` the node that asked."""
    return await _first(routes, await routes.cluster_groups(), bp.CONSUMER_RUNNING_INFO, group,
                        client_id)


async def consume_directly(routes: Routes, group: str, client_id: str,
                           offset_msg_id: str) -> dict[str, Any]:
    """Consumer ``client_id`` of ``group`` consumes the message ``offset_msg_id`` names once
    more, outside its queues (no offset moves): its result (``consumeResult`` CR_SUCCESS,
    CR_LATER, ..., ``remark``, ``spentTimeMills``), with ``node``. ``ValueError`` if the id is
    malformed."""
    home = bp.parse_offset_msg_id(offset_msg_id)[0]
    groups = [g for g in await routes.cluster_groups() if g.group == home]
    if not groups:
        raise errors.MessageNotFoundError(f"{offset_msg_id}: no broker group {home} is registered")
    return await _first(routes, groups, bp.CONSUME_DIRECTLY, group, client_id, offset_msg_id)


async def _first(routes: Routes, groups: list[GroupRoute], kind: int,
                 *args: Any) -> dict[str, Any]:
    """The first answer of any node of ``groups``; else the most telling error."""
    async def one(g: GroupRoute, node: str) -> dict[str, Any]:
        answer = await routes.group_client(g).call(node, kind, *args, timeout_s=ASK_TIMEOUT_S)
        return {**answer, "node": f"{g.group}/{node}"}

    tasks = [asyncio.ensure_future(one(g, n)) for g in groups for n in sorted(g.nodes)]
    if not tasks:
        raise errors.UnavailableError("no broker group is registered at the NameServer")
    failures: list[errors.ClientError] = []
    try:
        for done in asyncio.as_completed(tasks):
            try:
                return await done
            except DLedgerError as err:
                failures.append(client_error(err))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    telling = [f for f in failures if not isinstance(f, (errors.ClientNotConnectedError,
                                                         errors.UnavailableError))]
    if telling:
        raise telling[0]
    refused = sum(isinstance(f, errors.ClientNotConnectedError) for f in failures)
    raise errors.ClientNotConnectedError(
        f"consumer {args[1]!r} of group {args[0]!r} is connected through a protocol the broker "
        f"can ask (RocketMQ 4.x remoting) to none of the {refused} node(s) that answered, of "
        f"{len(tasks)} asked")
