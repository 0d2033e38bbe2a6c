"""The request handlers of the core's kinds: pulls (PULL, PULL_SQL), topics (TOPIC_PUT,
TOPIC_DELETE), consumer offsets (OFFSET_COMMIT, OFFSET_QUERY, SEARCH_OFFSET), consumers'
heartbeats, the node's status and leadership transfer. Each field is checked by the table
(``broker.core.requests``) before the handler runs; the handler checks what needs the broker's
state, then calls it.

Read rules (RocketMQ's pull rules): a pull of a topic this node knows needs read permission
(NO_PERMISSION) and a queue id below the topic's read queue count (QUEUE_NOT_FOUND). A topic
this node does not know reads as an empty queue: a replica cannot tell a topic that does not
exist from one whose creation it has not applied yet (a long poll on a follower waits for the
first send to an auto-created topic). An offset commit, which the log keeps for good, needs the
topic to exist on the leader and the queue to be one of its read queues. SEARCH_OFFSET and
OFFSET_QUERY read no message and, as in RocketMQ, check neither: a queue nobody committed on
answers -1, one that holds nothing answers offset 0.
"""

from __future__ import annotations

from typing import Any

from broker.api.broker import Broker
from broker.core.entries import OffsetCommit, TopicDelete, TopicPut
from broker.core.requests import (
    MODELS,
    PULL_TAGS_MAX,
    Handler,
    handlers,
    integer,
    offset,
    one_of,
    queue_id,
    readable_topic,
    sql_expression,
    strings,
    subscriptions,
    text,
    user_topic,
)
from protocol.broker_errors import BadRequestError
from protocol.broker_kinds import (
    BROKER_STATUS,
    HEARTBEAT,
    OFFSET_COMMIT,
    OFFSET_QUERY,
    PULL,
    PULL_SQL,
    SEARCH_OFFSET,
    TOPIC_DELETE,
    TOPIC_PUT,
    TRANSFER_LEADERSHIP,
    SendRefusedError,
)
from protocol.filter_sql import SqlFilter
from protocol.topics import HALF_TOPIC, MAX_QUEUES, TopicConfig, validate_config

__all__ = ["HANDLERS"]

HANDLERS: list[Handler] = []
handles = handlers(HANDLERS)


# -- rules that need the broker's state -------------------------------------------------------

def _queue_of(broker: Broker, topic: str, qid: int) -> TopicConfig | None:
    """The topic's config, once ``qid`` is known to be one of its read queues (None: a topic
    this node does not know)."""
    cfg = broker.state.topics.get(topic)
    if cfg is not None and qid >= cfg.read_queues:
        raise SendRefusedError("QUEUE_NOT_FOUND",
                               f"queue {qid} of {topic}, which has {cfg.read_queues} read queues")
    return cfg


def _check_readable(broker: Broker, topic: str, qid: int) -> None:
    """A pull's rules: one of the topic's read queues, and the topic readable; the half
    messages of open transactions are no consumer's to read."""
    if topic == HALF_TOPIC:
        raise SendRefusedError("NO_PERMISSION", f"{topic} holds uncommitted transactions")
    cfg = _queue_of(broker, topic, qid)
    if cfg is not None and not cfg.readable:
        raise SendRefusedError("NO_PERMISSION", f"{topic} is not readable (perm {cfg.perm})")


# -- the handlers ---------------------------------------------------------------------------------

@handles(PULL, topic=readable_topic, queue_id=queue_id, offset=offset, max_messages=integer(),
         max_bytes=integer(), suspend_ms=integer(), tags=strings(PULL_TAGS_MAX))
async def pull(broker: Broker, topic: str, qid: int, start: int, max_messages: int,
               max_bytes: int, suspend_ms: int, tags: list[str]) -> list[Any]:
    _check_readable(broker, topic, qid)
    return await broker.pull(topic, qid, start, max_messages, max_bytes, suspend_ms, tags)


@handles(PULL_SQL, topic=readable_topic, queue_id=queue_id, offset=offset, max_messages=integer(),
         max_bytes=integer(), suspend_ms=integer(), sql=sql_expression)
async def pull_sql(broker: Broker, topic: str, qid: int, start: int, max_messages: int,
                   max_bytes: int, suspend_ms: int, sql: SqlFilter) -> list[Any]:
    _check_readable(broker, topic, qid)
    return await broker.pull(topic, qid, start, max_messages, max_bytes, suspend_ms, ["*"], sql)


@handles(TOPIC_PUT, name=user_topic, read_queues=integer(0, MAX_QUEUES),
         write_queues=integer(0, MAX_QUEUES), perm=integer(0, 7))
async def topic_put(broker: Broker, name: str, read_queues: int, write_queues: int,
                    perm: int) -> str:
    validate_config(TopicConfig(name, read_queues, write_queues, perm))  # perm 2, 4 or 6
    return (await broker.leader_commit(TopicPut(name, read_queues, write_queues, perm))).status


@handles(TOPIC_DELETE, name=user_topic)
async def topic_delete(broker: Broker, name: str) -> str:
    return (await broker.leader_commit(TopicDelete(name))).status


@handles(OFFSET_COMMIT, group=text(), topic=readable_topic, queue_id=queue_id, offset=offset)
async def offset_commit(broker: Broker, group: str, topic: str, qid: int,
                        committed: int) -> str:
    await broker.node.read_barrier()  # the leader's topics include every earlier commit
    if _queue_of(broker, topic, qid) is None:
        raise SendRefusedError("TOPIC_NOT_FOUND", topic)
    return (await broker.leader_commit(OffsetCommit(group, topic, qid, committed))).status


@handles(OFFSET_QUERY, group=text(), topic=readable_topic, queue_id=queue_id)
async def offset_query(broker: Broker, group: str, topic: str, qid: int) -> int:
    await broker.node.read_barrier()  # the leader, with every earlier commit applied
    return broker.state.offsets.get((group, topic, qid), -1)


@handles(SEARCH_OFFSET, topic=readable_topic, queue_id=queue_id, timestamp_ms=integer())
async def search_offset(broker: Broker, topic: str, qid: int, timestamp_ms: int) -> int:
    return broker.state.offset_at(topic, qid, timestamp_ms)


@handles(BROKER_STATUS)
async def broker_status(broker: Broker) -> dict[str, Any]:
    return broker.status()


@handles(TRANSFER_LEADERSHIP, node_id=text())
async def transfer_leadership(broker: Broker, node_id: str) -> bool:
    voters = broker.node.membership_status()["voters"]
    assert isinstance(voters, list)
    if node_id not in voters:
        raise BadRequestError(f"transfer_leadership: {node_id!r} is not a voter of group "
                              f"{broker.group} ({', '.join(voters)})")
    broker.require_leader()
    await broker.node.transfer_leadership(node_id)
    return True


@handles(HEARTBEAT, with_connection=True, client_id=text(), group=text(), model=one_of(*MODELS),
         subscriptions=subscriptions, ttl_ms=integer())  # members clamp the ttl
async def heartbeat(broker: Broker, connection: object, client_id: str, group: str, model: str,
                    subs: dict[str, str], ttl_ms: int) -> list[str]:
    return broker.heartbeat(client_id, group, model, subs, ttl_ms / 1000, connection)
