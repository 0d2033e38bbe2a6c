"""What a member of a clustering consumer group does at the brokers, whatever it then does with
the messages: read a tag expression, heartbeat every node of its topics (the group's live members
come back; the nodes' notices of a change go to a handler), compute its share of the queues,
find where a queue its group never committed starts, and tell whether the members subscribe
alike (``subscription_conflict``, also used by ``dledger consumer status`` and the console).
Functions over a ``PullConsumer``; no state and no tasks of its own (the callers loop).

Used by the lite pull consumer (``client.consumer.lite``) and the push consumer (``client.consumer.push``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from client import errors
from client.consumer.pull import PullConsumer
from client.consumer.rebalance import Strategy
from client.types import MessageQueue
from protocol import broker_kinds as bp
from protocol.consume_rules import RETRY_PREFIX
from protocol.errors import DLedgerError
from protocol.group_client import GroupClient, PushHandler

START_FROM = ("first", "last", "timestamp")  # RocketMQ's CONSUME_FROM_FIRST/LAST/TIMESTAMP
HEARTBEAT_TIMEOUT_S = 2.0  # one node's answer to a heartbeat


def check_start(start_from: str, start_timestamp_ms: int | None) -> None:
    """ValueError unless ``start_from`` is known and a timestamp comes with "timestamp" only."""
    if start_from not in START_FROM:
        raise ValueError(f"start_from is one of {', '.join(START_FROM)}, not {start_from!r}")
    if (start_from == "timestamp") != (start_timestamp_ms is not None):
        raise ValueError("start_from='timestamp' goes with start_timestamp_ms, and only it")
    if start_timestamp_ms is not None and (type(start_timestamp_ms) is not int
                                           or start_timestamp_ms < 0):
        raise ValueError(f"start_timestamp_ms is milliseconds since the epoch, not "
                         f"{start_timestamp_ms!r}")


def tag_expression(tags: str | None) -> str:
    """The expression as stored and sent in heartbeats: an empty one (or None) is ``*``."""
    return (tags or "").strip() or "*"


def tag_list(expression: str) -> list[str]:
    """``"A || B"`` -> ``["A", "B"]``; ``"*"`` (or nothing between the bars) -> ``["*"]``."""
    return [t.strip() for t in expression.split("||") if t.strip()] or ["*"]


async def heartbeat(pull: PullConsumer, client_id: str, group: str, subs: dict[str, str],
                    ttl_ms: int, model: str = "clustering",
                    on_notice: PushHandler | None = None) -> set[str]:
    """Heartbeat (``ttl_ms`` 0: leave the group) at every node of every group serving the
    topics of ``subs``, all at once; the members any node knows of. A node that does not
    answer is skipped: the others do. ``on_notice`` gets the frames the nodes send unasked on
    these connections (CONSUMER_IDS_CHANGED: the group changed)."""
    async def one(client: GroupClient, node: str) -> list[str]:
        try:
            got = await client.call(node, bp.HEARTBEAT, client_id, group, model, subs, ttl_ms,
                                    timeout_s=HEARTBEAT_TIMEOUT_S)
        except DLedgerError:
            return []
        return [str(m) for m in got]

    targets: list[tuple[GroupClient, str]] = []  # (coroutines made only once all are known: a
    for topic in subs:                         # cancel meanwhile would leave them unawaited)
        try:
            routes = await pull.groups(topic)
        except errors.ClientError:
            continue  # no route yet: the next heartbeat tries again
        targets += [(pull.group_client(g), node) for g in routes for node in g.nodes]
    if on_notice is not None:
        for client, _ in targets:
            client.set_push_handler(on_notice)
    return {m for got in await asyncio.gather(*(one(c, n) for c, n in targets)) for m in got}


async def share(pull: PullConsumer, client_id: str, members: list[str], topics: list[str],
                strategy: Strategy) -> tuple[set[MessageQueue], set[MessageQueue]]:
    """(this member's queues of ``topics`` by ``strategy``, every queue seen). A topic that does
    not exist (yet) has none."""
    mine: set[MessageQueue] = set()
    seen: set[MessageQueue] = set()
    for topic in topics:
        try:
            queues = await pull.fetch_queues(topic)
        except errors.TopicNotFoundError:
            continue
        seen.update(queues)
        mine.update(strategy(client_id, members, queues))
    return mine, seen


async def start_offset(pull: PullConsumer, mq: MessageQueue, start_from: str,
                       start_timestamp_ms: int | None, *, from_first: bool = False) -> int:
    """Where ``mq`` starts for a group that never committed an offset on it: its first offset,
    its last (the default), or the first message stored at or after ``start_timestamp_ms``;
    ``from_first`` overrides (a queue that appeared while the member ran holds only messages
    sent after it subscribed)."""
    if from_first or start_from == "first":
        return 0  # (below the queue's minimum after retention: the first pull says where it is)
    if start_from == "timestamp":
        assert start_timestamp_ms is not None  # check_start() made sure
        return await pull.offset_for_timestamp(mq, start_timestamp_ms)
    return (await pull.pull(mq, 0, 0)).max_offset


def subscription_conflict(members: Iterable[Mapping[str, Any]]) -> str | None:
    """None when the clustering members (CONSUMER_STATUS's ``{"client_id", "model",
    "subscriptions"}``) subscribe to the same topics with the same expressions, their retry
    topics aside; else who subscribes to what, in one line. Members that differ lose messages:
    each is given queues of topics (or tags) it does not read, and nobody else reads them."""
    kinds: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for m in members:
        if m.get("model", "clustering") != "clustering":
            continue  # (broadcasting: every member reads every queue of its own topics)
        subs = tuple(sorted((str(t), str(e)) for t, e in dict(m["subscriptions"]).items()
                            if not str(t).startswith(RETRY_PREFIX)))
        kinds.setdefault(subs, []).append(str(m["client_id"]))
    if len(kinds) < 2:
        return None
    return " | ".join(f"{', '.join(sorted(ids))}: "
                      + ("; ".join(f"{t} {e}" for t, e in subs) or "nothing")
                      for subs, ids in sorted(kinds.items(), key=lambda kv: sorted(kv[1])))
