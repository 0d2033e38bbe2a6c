"""The broker's admin requests about consumer groups (issue 18's admin part): OFFSET_RESET, a
consumer group's offsets on every read queue of a topic set to a time, in one entry; and
CONSUMER_STATUS, one node's view of a group (its live members with their subscriptions, as
their heartbeats told this node, and its offsets against the queues' max offsets). Also
STATE_DIGEST (issue 19): a CRC32 of this node's whole state machine, to compare replicas. And
SUBSCRIPTION_GROUP_PUT / _GET: a consumer group's settings (its retry policy's maximum
delivery attempts, ``broker.features.admin.model``), set through the log and read on the leader.

Its handlers are in ``HANDLERS`` (``broker.api.table``); owns no state: it reads the broker's state
machine and membership and proposes through the broker.

A reset is refused (GROUP_ACTIVE) while live members of the group subscribe to the topic: the
push and lite consumers keep their progress in memory and commit it every few seconds, so they
would overwrite the reset (Kafka's rule: a reset needs an inactive group). ``force`` resets all
the same. A consumer that assigns itself queues (``LitePullConsumer.assign``) sends no
heartbeats, so it is not seen here: stop it first.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from broker.core.members import GroupMembers
from broker.core.requests import Handler, brief, handlers, integer, readable_topic, text
from broker.features.admin.entries import OffsetReset, SubscriptionGroupPut
from broker.features.admin.model import check_attempts
from broker.features.host import BrokerHost
from protocol.broker_errors import BrokerError
from protocol.broker_kinds import (
    CONSUMER_STATUS,
    OFFSET_RESET,
    STATE_DIGEST,
    SUBSCRIPTION_GROUP_GET,
    SUBSCRIPTION_GROUP_PUT,
    SendRefusedError,
)
from protocol.errors import DLedgerError

HANDLERS: list[Handler] = []
handles = handlers(HANDLERS)


class AdminHost(BrokerHost, Protocol):
    @property
    def members(self) -> GroupMembers: ...

    def retained_offset(self, topic: str, queue_id: int) -> int:
        """The queue's first offset whose message the local log still holds."""
        ...


class GroupActiveError(BrokerError):
    """A consumer group's offsets cannot be reset while live members consume the topic (they
    would overwrite it with their own progress); the message names them."""

    code = "GROUP_ACTIVE"


def boolean(v: Any) -> bool:
    if type(v) is not bool:
        raise ValueError(f"must be true or false, got {brief(v)}")
    return v


def subscribers(broker: AdminHost, group: str, topic: str) -> list[str]:
    """The live members of ``group`` on this node that subscribe to ``topic``."""
    return [m.client_id for m in broker.members.members(group, time.monotonic())
            if any(t == topic for t, _ in m.subscriptions)]


@handles(OFFSET_RESET, group=text(), topic=readable_topic, timestamp_ms=integer(),
         force=boolean)
async def offset_reset(broker: AdminHost, group: str, topic: str, timestamp_ms: int,
                       force: bool) -> list[list[int]]:
    broker.require_leader()
    await broker.node.read_barrier()  # offsets and queues as every earlier commit left them
    cfg = broker.state.topics.get(topic)
    if cfg is None:
        raise SendRefusedError("TOPIC_NOT_FOUND", topic)
    active = subscribers(broker, group, topic)
    if active and not force:
        raise GroupActiveError(
            f"consumer group {group!r} has {len(active)} live member(s) on {topic} "
            f"({', '.join(active[:8])}{', ...' if len(active) > 8 else ''}), which would "
            f"overwrite the reset with their own progress: stop them first (or force it)")
    rows = []
    for qid in range(cfg.read_queues):
        new = max(broker.state.offset_at(topic, qid, timestamp_ms),
                  broker.retained_offset(topic, qid))  # the rule of pulls
        rows.append([qid, broker.state.offsets.get((group, topic, qid), -1), new])
    if rows:
        await broker.leader_commit(OffsetReset(group, topic, tuple((q, n) for q, _, n in rows)))
    return rows


@handles(CONSUMER_STATUS, group=text())
async def consumer_status(broker: AdminHost, group: str) -> dict[str, Any]:
    leader = broker.node.is_leader
    if leader:
        try:
            await broker.node.read_barrier()  # the leader's offsets: every commit included
        except DLedgerError:
            leader = False  # deposed meanwhile: this node's offsets may lag
    now = time.monotonic()
    members = broker.members.members(group, now)
    state = broker.state
    topics = {t for m in members for t, _ in m.subscriptions}
    topics.update(t for g, t, _ in state.offsets if g == group)
    queues = []
    for topic in sorted(topics):
        cfg = state.topics.get(topic)
        for qid in range(cfg.read_queues if cfg is not None else 0):
            queues.append([topic, qid, state.offsets.get((group, topic, qid), -1),
                           state.queue_range(topic, qid)[1]])
    return {"node": broker.config.node.node_id, "leader": leader,
            "members": [{"client_id": m.client_id, "model": m.model,
                         "subscriptions": dict(m.subscriptions),
                         "expires_in_ms": max(0, int((m.expires_at - now) * 1000))}
                        for m in members],
            "queues": queues}


@handles(STATE_DIGEST)
async def state_digest(broker: AdminHost) -> list[int]:
    """This node's state machine as a CRC32 (of its checkpoint's bytes), to compare replicas."""
    store = broker.node.store
    first, last = (store.first_index(), store.last_index()) if store is not None else (0, 0)
    view = broker.state.snapshot_view()  # (its CRC chunk by chunk: no copy of a large state)
    try:
        return [broker.state.applied_index, view.crc32(), first, last]
    finally:
        view.release()


def _groups_view(broker: AdminHost, group: str) -> dict[str, Any]:
    """The settings of ``group`` ("": of every group with one) as this node's state has them."""
    table = broker.state.subscription_groups
    rows = table.groups() if not group else \
        [(group, g) for g in (table.get(group),) if g is not None]
    return {"default_max_delivery_attempts": broker.config.grpc_max_delivery_attempts,
            "groups": [{"group": name, "max_delivery_attempts": g.max_delivery_attempts}
                       for name, g in rows]}


@handles(SUBSCRIPTION_GROUP_PUT, group=text(), max_delivery_attempts=check_attempts)
async def subscription_group_put(broker: AdminHost, group: str,
                                 attempts: int | None) -> dict[str, Any]:
    broker.require_leader()
    await broker.leader_commit(SubscriptionGroupPut(int(time.time() * 1000), group, attempts))
    return _groups_view(broker, group)


def group_or_all(v: Any) -> str:
    """A consumer group's name, or "" for every group."""
    return "" if v == "" else text()(v)


@handles(SUBSCRIPTION_GROUP_GET, group=group_or_all)
async def subscription_group_get(broker: AdminHost, group: str) -> dict[str, Any]:
    broker.require_leader()
    await broker.node.read_barrier()  # every setting committed before this read
    return _groups_view(broker, group)
