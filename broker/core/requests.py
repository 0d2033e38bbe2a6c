"""The broker's request handlers, as a table: each handler declares its request kind and its
fields, in wire order, with a check for each (``handlers``); ``table_of`` puts the handlers of
every module in one table (``broker.api.table`` lists them) and ``dispatch`` runs one request.

``dispatch`` refuses a request whose argument count differs (missing or extra arguments) or any
of whose fields has the wrong type or is out of range, with a ``BadRequestError`` naming the
request and the field, before the handler runs; so a handler gets well-typed values and only
checks what needs the broker's state (a topic's permission, its queue counts, leadership). The
sends (SEND and SEND_RUNS) are not in the table: their hot path is ``broker.api.sendpath``.
Owns the field checks every handler shares. Pure.
"""

from __future__ import annotations

import functools
import reprlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from protocol.broker_errors import BadRequestError
from protocol.broker_kinds import INT_MAX, SEND_KINDS
from protocol.envelope import Request
from protocol.filter_sql import SqlFilter, compile_sql
from protocol.topics import MAX_QUEUES, validate_topic_name

__all__ = ["EXPRESSION_MAX_CHARS", "ID_MAX_CHARS", "LOCK_QUEUES_MAX", "MODELS", "PULL_TAGS_MAX",
           "Check", "Handler", "brief", "dispatch", "handlers", "integer", "lock_queues",
           "offset", "one_of", "queue_id", "readable_topic", "sql_expression", "strings",
           "subscriptions", "table_of", "text", "user_topic"]

ID_MAX_CHARS = 255  # client ids, consumer group names, node ids
PULL_TAGS_MAX = 1024  # tags in one pull's filter
SUBSCRIPTIONS_MAX = 1024  # topics in one heartbeat
EXPRESSION_MAX_CHARS = 4096  # one subscription's tag expression
MODELS = ("clustering", "broadcasting")
LOCK_QUEUES_MAX = 1024  # queues in one lock request
SQL_FILTERS_CACHED = 256  # compiled SQL filters kept (by text): at most 4096 characters each

Check = Callable[[Any], Any]  # returns the (checked) value or raises ValueError saying why
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


@dataclass(frozen=True, slots=True)
class Handler:
    kind: int
    name: str
    fields: tuple[tuple[str, Check], ...]
    run: Callable[..., Awaitable[Any]]
    with_connection: bool = False  # run(server, connection, *fields): the request's connection

    def parse(self, args: list[Any]) -> list[Any]:
        if len(args) != len(self.fields):
            names = ", ".join(n for n, _ in self.fields) or "no arguments"
            raise BadRequestError(f"{self.name} takes {len(self.fields)} arguments ({names}), "
                                  f"got {len(args)}")
        out = []
        for (name, check), value in zip(self.fields, args):
            try:
                out.append(check(value))
            except ValueError as err:
                raise BadRequestError(f"{self.name}: {name} {err}") from err
        return out


def handlers(into: list[Handler]) -> Callable[..., Callable[[F], F]]:
    """A decorator that adds ``async def h(broker, *fields)`` to ``into`` as the handler of a
    kind: ``@handles(KIND, field=check, ...)`` (``with_connection=True``: ``h(broker,
    connection, *fields)``, for a handler that keeps the connection to send on it later). Each
    handlers module keeps its list; ``broker.api.table`` puts every list in one table."""
    def handles(kind: int, *, with_connection: bool = False, **fields: Check) -> Callable[[F], F]:
        def register(fn: F) -> F:
            into.append(Handler(kind, fn.__name__, tuple(fields.items()), fn, with_connection))
            return fn
        return register
    return handles


def table_of(*modules: list[Handler]) -> dict[int, Handler]:
    """Every handler of ``modules`` by kind; a kind handled twice, or a send kind (the send
    path's), is refused."""
    table: dict[int, Handler] = {}
    for handlers_ in modules:
        for h in handlers_:
            if h.kind in table or h.kind in SEND_KINDS:
                raise ValueError(f"request kind {h.kind} has a handler already")
            table[h.kind] = h
    return table


async def dispatch(table: dict[int, Handler], broker: Any, req: Request,
                   connection: Any = None) -> Any:
    handler = table.get(req.kind)
    if handler is None:
        raise BadRequestError(f"unknown request kind {req.kind}")
    if handler.with_connection:
        return await handler.run(broker, connection, *handler.parse(req.args))
    return await handler.run(broker, *handler.parse(req.args))


# -- field checks --------------------------------------------------------------------------------

def brief(value: Any) -> str:
    return f"{type(value).__name__} {reprlib.repr(value)}"  # bounded, however large the input


def integer(lo: int = 0, hi: int = INT_MAX) -> Check:
    def check(v: Any) -> int:
        if type(v) is not int or not lo <= v <= hi:
            raise ValueError(f"must be an integer in {lo}..{hi}, got {brief(v)}")
        return v
    return check


def text(max_chars: int = ID_MAX_CHARS) -> Check:
    def check(v: Any) -> str:
        if type(v) is not str or not 0 < len(v) <= max_chars:
            raise ValueError(f"must be a string of 1..{max_chars} characters, got {brief(v)}")
        return v
    return check


def one_of(*choices: str) -> Check:
    def check(v: Any) -> str:
        if v not in choices or type(v) is not str:
            raise ValueError(f"must be one of {', '.join(choices)}, got {brief(v)}")
        return v
    return check


def strings(max_items: int, max_chars: int = EXPRESSION_MAX_CHARS) -> Check:
    def check(v: Any) -> list[str]:
        if type(v) is not list or len(v) > max_items \
                or any(type(s) is not str or len(s) > max_chars for s in v):
            raise ValueError(f"must be a list of at most {max_items} strings, got {brief(v)}")
        return v
    return check


def subscriptions(v: Any) -> dict[str, str]:
    """A heartbeat's ``{topic: tag expression}``."""
    if type(v) is not dict or len(v) > SUBSCRIPTIONS_MAX:
        raise ValueError(f"must be a map of at most {SUBSCRIPTIONS_MAX} topics, got {brief(v)}")
    for topic, expression in v.items():
        readable_topic(topic)
        if type(expression) is not str or len(expression) > EXPRESSION_MAX_CHARS:
            raise ValueError(f"[{topic!r}] must be a tag expression string, got {brief(expression)}")
    return v


@functools.lru_cache(maxsize=SQL_FILTERS_CACHED)
def sql_filter(v: str) -> SqlFilter:
    """A pull's SQL92 expression, compiled once per distinct text (the consumers of a group pull
    with the same one). A malformed one raises SqlFilterError, a ValueError naming the offset."""
    return compile_sql(v)


def sql_expression(v: Any) -> SqlFilter:
    if type(v) is not str:
        raise ValueError(f"must be an SQL92 expression string, got {brief(v)}")
    return sql_filter(v)


def lock_queues(v: Any) -> list[tuple[str, int]]:
    """An orderly consumer's ``[[topic, queue id], ...]``."""
    if type(v) is not list or len(v) > LOCK_QUEUES_MAX:
        raise ValueError(f"must be a list of at most {LOCK_QUEUES_MAX} queues, got {brief(v)}")
    out = []
    for q in v:
        if type(q) is not list or len(q) != 2:
            raise ValueError(f"a queue is [topic, queue id], got {brief(q)}")
        out.append((readable_topic(q[0]), queue_id(q[1])))
    return out


def readable_topic(v: Any) -> str:
    """A topic name to read: system topics (retry, delay, ...) are read like any other."""
    return validate_topic_name(v, allow_system=True)


def user_topic(v: Any) -> str:
    """A topic name a request may create or delete: reserved system names are refused."""
    return validate_topic_name(v)


queue_id = integer(0, MAX_QUEUES - 1)
offset = integer()


