"""The request table's pop kinds (``broker.core.requests``): POP_RECEIVE, POP_ACK, POP_CHANGE and
POP_DEAD, each field checked before the pop service (``broker.features.pop.service``) is called."""

from __future__ import annotations

from typing import Any, Protocol

from broker.core.requests import (
    PULL_TAGS_MAX,
    Handler,
    brief,
    handlers,
    integer,
    queue_id,
    readable_topic,
    sql_filter,
    strings,
    text,
)
from broker.features.pop.entries import POP_ITEMS_MAX
from broker.features.pop.model import INVISIBLE_MS_MAX, INVISIBLE_MS_MIN
from broker.features.pop.service import PopService
from protocol.broker_kinds import (
    MAX_PULL_MESSAGES,
    MAX_SUSPEND_MS,
    POP_ACK,
    POP_CHANGE,
    POP_DEAD,
    POP_RECEIVE,
)
from protocol.consume_rules import MAX_RECONSUME_TIMES_LIMIT
from protocol.filter_sql import SqlFilter

HANDLERS: list[Handler] = []
handles = handlers(HANDLERS)


class PopHandlersHost(Protocol):
    @property
    def pops(self) -> PopService: ...


POLL_MS_MAX = 2 * MAX_SUSPEND_MS  # RocketMQ 5 clients long-poll for 30 s


def any_queue(v: Any) -> int:
    """A queue id, or -1 for any queue of the topic."""
    return -1 if v == -1 and type(v) is int else queue_id(v)


def optional_sql(v: Any) -> SqlFilter | None:
    if type(v) is not str:
        raise ValueError(f"must be an SQL92 expression string (\"\": none), got {brief(v)}")
    return sql_filter(v) if v else None


def receipts(v: Any) -> list[tuple[int, int]]:
    """An ack's ``[[offset, epoch], ...]``."""
    if type(v) is not list or not 0 < len(v) <= POP_ITEMS_MAX:
        raise ValueError(f"must be a list of 1..{POP_ITEMS_MAX} receipts, got {brief(v)}")
    out = []
    for r in v:
        if type(r) is not list or len(r) != 2:
            raise ValueError(f"a receipt is [offset, epoch], got {brief(r)}")
        out.append((integer()(r[0]), integer(1)(r[1])))
    return out


invisible_ms = integer(INVISIBLE_MS_MIN, INVISIBLE_MS_MAX)
max_attempts = integer(1, MAX_RECONSUME_TIMES_LIMIT)


@handles(POP_RECEIVE, group=text(), topic=readable_topic, queue_id=any_queue,
         max_messages=integer(1, MAX_PULL_MESSAGES), invisible_ms=invisible_ms,
         tags=strings(PULL_TAGS_MAX), sql=optional_sql, poll_ms=integer(0, POLL_MS_MAX),
         max_attempts=max_attempts)
async def pop_receive(broker: PopHandlersHost, group: str, topic: str, qid: int, max_messages: int,
                      invisible: int, tags: list[str], sql: SqlFilter | None, poll_ms: int,
                      attempts: int) -> list[Any]:
    return await broker.pops.receive(group, topic, qid, max_messages, invisible, tags, sql,
                                     poll_ms, attempts)


@handles(POP_ACK, group=text(), topic=readable_topic, queue_id=queue_id, receipts=receipts)
async def pop_ack(broker: PopHandlersHost, group: str, topic: str, qid: int,
                  acks: list[tuple[int, int]]) -> list[bool]:
    return await broker.pops.ack(group, topic, qid, acks)


@handles(POP_CHANGE, group=text(), topic=readable_topic, queue_id=queue_id, offset=integer(),
         epoch=integer(1), invisible_ms=invisible_ms)
async def pop_change(broker: PopHandlersHost, group: str, topic: str, qid: int, offset: int,
                     epoch: int, invisible: int) -> int:
    return await broker.pops.change(group, topic, qid, offset, epoch, invisible)


@handles(POP_DEAD, group=text(), topic=readable_topic, queue_id=queue_id, offset=integer(),
         epoch=integer(1), max_attempts=max_attempts)
async def pop_dead(broker: PopHandlersHost, group: str, topic: str, qid: int, offset: int,
                   epoch: int, attempts: int) -> str:
    return await broker.pops.dead_letter(group, topic, qid, offset, epoch, attempts)
