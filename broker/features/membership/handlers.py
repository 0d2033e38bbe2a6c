"""The broker's requests that change its group's membership (issue 19): MEMBER_ADD (a new node
joins as a learner, at the peer address given), MEMBER_PROMOTE (a learner that has caught up
becomes a voter), MEMBER_REMOVE (a voter or learner leaves; the leader itself too: it leads
until the change commits, then steps down). Each answers once its change is committed, with
the membership then in force. Leader only; the rules (one change at a time, one voter at a
time, a voter must first catch up as a learner) are the Raft core's (``dledger.raft.membership``)
and come back as MembershipChangeError, by name.

Registers with ``broker.core.requests``; owns no state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.core.requests import handles, integer, text
from protocol.broker_kinds import MEMBER_ADD, MEMBER_PROMOTE, MEMBER_REMOVE
from dledger.membership.shell import parse_address

if TYPE_CHECKING:
    from broker.server import BrokerServer

TIMEOUT_MS_MAX = 600_000


def address(v: Any) -> str:
    if type(v) is not str:
        raise ValueError(f"must be a host:port string, got {type(v).__name__}")
    parse_address(v)
    return v


def _membership(server: BrokerServer) -> dict[str, Any]:
    return server.node.membership_status()


@handles(MEMBER_ADD, node_id=text(), peer_address=address, timeout_ms=integer(1, TIMEOUT_MS_MAX))
async def member_add(server: BrokerServer, node_id: str, peer_address: str,
                     timeout_ms: int) -> dict[str, Any]:
    server.require_leader()
    await server.node.add_learner(node_id, peer_address, timeout_ms / 1000)
    return _membership(server)


@handles(MEMBER_PROMOTE, node_id=text(), timeout_ms=integer(1, TIMEOUT_MS_MAX))
async def member_promote(server: BrokerServer, node_id: str, timeout_ms: int) -> dict[str, Any]:
    server.require_leader()
    await server.node.promote(node_id, timeout_ms / 1000)
    return _membership(server)


@handles(MEMBER_REMOVE, node_id=text(), timeout_ms=integer(1, TIMEOUT_MS_MAX))
async def member_remove(server: BrokerServer, node_id: str, timeout_ms: int) -> dict[str, Any]:
    server.require_leader()
    await server.node.remove_member(node_id, timeout_ms / 1000)
    return _membership(server)
