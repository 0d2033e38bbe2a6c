"""The broker's requests that change its group's membership (issue 19): MEMBER_ADD (a new node
joins as a learner, at the peer address given), MEMBER_PROMOTE (a learner that has caught up
becomes a voter), MEMBER_REMOVE (a voter or learner leaves; the leader itself too: it leads
until the change commits, then steps down). Each answers once its change is committed, with
the membership then in force. Leader only; the rules (one change at a time, one voter at a
time, a voter must first catch up as a learner) are the Raft core's (``dledger.raft.membership``)
and come back as MembershipChangeError, by name.

Its handlers are in ``HANDLERS`` (``broker.api.table``); owns no state.
"""

from __future__ import annotations

from typing import Any

from broker.core.requests import Handler, handlers, integer, text
from broker.features.host import BrokerHost
from dledger.membership.shell import parse_address
from protocol.broker_kinds import MEMBER_ADD, MEMBER_PROMOTE, MEMBER_REMOVE

HANDLERS: list[Handler] = []
handles = handlers(HANDLERS)

TIMEOUT_MS_MAX = 600_000


def address(v: Any) -> str:
    if type(v) is not str:
        raise ValueError(f"must be a host:port string, got {type(v).__name__}")
    parse_address(v)
    return v


def _membership(broker: BrokerHost) -> dict[str, Any]:
    return broker.node.membership_status()


@handles(MEMBER_ADD, node_id=text(), peer_address=address, timeout_ms=integer(1, TIMEOUT_MS_MAX))
async def member_add(broker: BrokerHost, node_id: str, peer_address: str,
                     timeout_ms: int) -> dict[str, Any]:
    broker.require_leader()
    await broker.node.add_learner(node_id, peer_address, timeout_ms / 1000)
    return _membership(broker)


@handles(MEMBER_PROMOTE, node_id=text(), timeout_ms=integer(1, TIMEOUT_MS_MAX))
async def member_promote(broker: BrokerHost, node_id: str, timeout_ms: int) -> dict[str, Any]:
    broker.require_leader()
    await broker.node.promote(node_id, timeout_ms / 1000)
    return _membership(broker)


@handles(MEMBER_REMOVE, node_id=text(), timeout_ms=integer(1, TIMEOUT_MS_MAX))
async def member_remove(broker: BrokerHost, node_id: str, timeout_ms: int) -> dict[str, Any]:
    broker.require_leader()
    await broker.node.remove_member(node_id, timeout_ms / 1000)
    return _membership(broker)
