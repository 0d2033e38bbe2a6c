"""The query requests (``protocol.broker_kinds`` kinds 120-123): VIEW_MESSAGE, QUERY_BY_KEY,
QUERY_BY_UNIQUE_KEY and QUERY_BY_TIME, in the request table (``broker.api.table``; each field
checked there before the handler runs; a malformed offset msg id is a BAD_REQUEST naming it).
Any replica answers, from what it has applied (``broker.features.query.lookup``)."""

from __future__ import annotations

from typing import Any

from broker.core.requests import Handler, handlers, integer, readable_topic
from broker.features.query.lookup import QUERY_MESSAGES_MAX, Lookup, LookupHost
from protocol.broker_errors import BadRequestError
from protocol.broker_kinds import (
    QUERY_BY_KEY,
    QUERY_BY_TIME,
    QUERY_BY_UNIQUE_KEY,
    VIEW_MESSAGE,
    parse_offset_msg_id,
)

HANDLERS: list[Handler] = []
handles = handlers(HANDLERS)

KEY_MAX_CHARS = 4096  # a key or unique key asked for


def offset_msg_id(v: Any) -> str:
    if type(v) is not str:
        raise ValueError(f"must be a string, got {type(v).__name__}")
    parse_offset_msg_id(v)
    return v


def key_text(v: Any) -> str:
    if type(v) is not str or not 0 < len(v) <= KEY_MAX_CHARS:
        raise ValueError(f"must be a string of 1..{KEY_MAX_CHARS} characters")
    return v


def any_or_topic(v: Any) -> str:
    """A topic name, or "" for any topic."""
    return "" if v == "" else readable_topic(v)


max_messages = integer(1, QUERY_MESSAGES_MAX)


@handles(VIEW_MESSAGE, offset_msg_id=offset_msg_id)
async def view_message(broker: LookupHost, offset_id: str) -> list[Any]:
    return Lookup(broker).view(offset_id)


@handles(QUERY_BY_KEY, topic=readable_topic, key=key_text, begin_ms=integer(), end_ms=integer(),
         max_messages=max_messages)
async def query_by_key(broker: LookupHost, topic: str, key: str, begin_ms: int, end_ms: int,
                       limit: int) -> list[list[Any]]:
    return Lookup(broker).by_key(topic, key, begin_ms, end_ms, limit)


@handles(QUERY_BY_UNIQUE_KEY, unique_key=key_text, topic=any_or_topic, max_messages=max_messages)
async def query_by_unique_key(broker: LookupHost, unique_key: str, topic: str,
                              limit: int) -> list[list[Any]]:
    return Lookup(broker).by_unique_key(unique_key, topic, limit)


@handles(QUERY_BY_TIME, topic=readable_topic, begin_ms=integer(), end_ms=integer(),
         max_messages=max_messages)
async def query_by_time(broker: LookupHost, topic: str, begin_ms: int, end_ms: int,
                        limit: int) -> list[list[Any]]:
    if begin_ms > end_ms:
        raise BadRequestError(f"query_by_time: begin_ms {begin_ms} is after end_ms {end_ms}")
    return Lookup(broker).by_time(topic, begin_ms, end_ms, limit)
