"""The broker's request table: request kind -> handler, for every kind but the sends (SEND and
SEND_RUNS, whose hot path is ``broker.api.sendpath``).

Each handler declares its fields, in wire order, with a check for each. ``dispatch`` refuses a
request whose argument count differs (missing or extra arguments) or any of whose fields has the
wrong type or is out of range, with a ``BadRequestError`` naming the request and the field,
before the handler runs; so a handler gets well-typed values and only checks what needs the
broker's state (a topic's permission, its queue counts, leadership), then calls the server.

Read rules (RocketMQ's pull rules): a pull of a topic this node knows needs read permission
(NO_PERMISSION) and a queue id below the topic's read queue count (QUEUE_NOT_FOUND). A topic
this node does not know reads as an empty queue: a replica cannot tell a topic that does not
exist from one whose creation it has not applied yet (a long poll on a follower waits for the
first send to an auto-created topic). An offset commit, which the log keeps for good, needs the
topic to exist on the leader and the queue to be one of its read queues. SEARCH_OFFSET and
OFFSET_QUERY read no message and, as in RocketMQ, check neither: a queue nobody committed on
answers -1, one that holds nothing answers offset 0.

Adding a request kind: its number in ``protocol.broker_kinds`` and one ``@handles(...)`` function here.
"""

from __future__ import annotations

import functools
import reprlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, TypeVar

from protocol.broker_errors import BadRequestError
from protocol.broker_kinds import (
    BROKER_STATUS,
    DLQ_RESEND,
    LOCK_BATCH,
    UNLOCK_BATCH,
    SEND_BACK,
    HEARTBEAT,
    OFFSET_COMMIT,
    OFFSET_QUERY,
    PULL,
    PULL_SQL,
    SEARCH_OFFSET,
    SEND_KINDS,
    TOPIC_DELETE,
    TOPIC_PUT,
    TRANSFER_LEADERSHIP,
    SendRefusedError,
)
from broker.core.entries import OffsetCommit, TopicDelete, TopicPut
from protocol.broker_kinds import INT_MAX
from protocol.filter_sql import SqlFilter, compile_sql
from protocol.consume_rules import MAX_RECONSUME_TIMES_LIMIT
from broker.features.txn.model import HALF_TOPIC
from protocol.topics import MAX_QUEUES, TopicConfig, validate_config, validate_topic_name
from protocol.envelope import Request

if TYPE_CHECKING:
    from broker.server import BrokerServer

__all__ = ["HANDLERS", "Handler", "dispatch", "handles", "served_kinds"]

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


HANDLERS: dict[int, Handler] = {}


def handles(kind: int, *, with_connection: bool = False, **fields: Check) -> Callable[[F], F]:
    """Register the decorated ``async def h(server, *fields)`` as the handler of ``kind``
    (``with_connection``: ``h(server, connection, *fields)``, for a handler that keeps the
    connection to send on it later)."""
    def register(fn: F) -> F:
        if kind in HANDLERS or kind in SEND_KINDS:
            raise ValueError(f"request kind {kind} has a handler already")
        HANDLERS[kind] = Handler(fn.__name__, tuple(fields.items()), fn, with_connection)
        return fn
    return register


def served_kinds() -> frozenset[int]:
    """Every request kind the broker answers (the sends and the table's)."""
    return frozenset({*SEND_KINDS, *HANDLERS})


async def dispatch(server: BrokerServer, req: Request, connection: Any = None) -> Any:
    handler = HANDLERS.get(req.kind)
    if handler is None:
        raise BadRequestError(f"unknown request kind {req.kind}")
    if handler.with_connection:
        return await handler.run(server, connection, *handler.parse(req.args))
    return await handler.run(server, *handler.parse(req.args))


# -- field checks --------------------------------------------------------------------------------

def _brief(value: Any) -> str:
    return f"{type(value).__name__} {reprlib.repr(value)}"  # bounded, however large the input


def integer(lo: int = 0, hi: int = INT_MAX) -> Check:
    def check(v: Any) -> int:
        if type(v) is not int or not lo <= v <= hi:
            raise ValueError(f"must be an integer in {lo}..{hi}, got {_brief(v)}")
        return v
    return check


def text(max_chars: int = ID_MAX_CHARS) -> Check:
    def check(v: Any) -> str:
        if type(v) is not str or not 0 < len(v) <= max_chars:
            raise ValueError(f"must be a string of 1..{max_chars} characters, got {_brief(v)}")
        return v
    return check


def one_of(*choices: str) -> Check:
    def check(v: Any) -> str:
        if v not in choices or type(v) is not str:
            raise ValueError(f"must be one of {', '.join(choices)}, got {_brief(v)}")
        return v
    return check


def strings(max_items: int, max_chars: int = EXPRESSION_MAX_CHARS) -> Check:
    def check(v: Any) -> list[str]:
        if type(v) is not list or len(v) > max_items \
                or any(type(s) is not str or len(s) > max_chars for s in v):
            raise ValueError(f"must be a list of at most {max_items} strings, got {_brief(v)}")
        return v
    return check


def subscriptions(v: Any) -> dict[str, str]:
    """A heartbeat's ``{topic: tag expression}``."""
    if type(v) is not dict or len(v) > SUBSCRIPTIONS_MAX:
        raise ValueError(f"must be a map of at most {SUBSCRIPTIONS_MAX} topics, got {_brief(v)}")
    for topic, expression in v.items():
        readable_topic(topic)
        if type(expression) is not str or len(expression) > EXPRESSION_MAX_CHARS:
            raise ValueError(f"[{topic!r}] must be a tag expression string, got {_brief(expression)}")
    return v


@functools.lru_cache(maxsize=SQL_FILTERS_CACHED)
def sql_filter(v: str) -> SqlFilter:
    """A pull's SQL92 expression, compiled once per distinct text (the consumers of a group pull
    with the same one). A malformed one raises SqlFilterError, a ValueError naming the offset."""
    return compile_sql(v)


def sql_expression(v: Any) -> SqlFilter:
    if type(v) is not str:
        raise ValueError(f"must be an SQL92 expression string, got {_brief(v)}")
    return sql_filter(v)


def lock_queues(v: Any) -> list[tuple[str, int]]:
    """An orderly consumer's ``[[topic, queue id], ...]``."""
    if type(v) is not list or len(v) > LOCK_QUEUES_MAX:
        raise ValueError(f"must be a list of at most {LOCK_QUEUES_MAX} queues, got {_brief(v)}")
    out = []
    for q in v:
        if type(q) is not list or len(q) != 2:
            raise ValueError(f"a queue is [topic, queue id], got {_brief(q)}")
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


# -- rules that need the broker's state -------------------------------------------------------

def _queue_of(server: BrokerServer, topic: str, qid: int) -> TopicConfig | None:
    """The topic's config, once ``qid`` is known to be one of its read queues (None: a topic
    this node does not know)."""
    cfg = server.state.topics.get(topic)
    if cfg is not None and qid >= cfg.read_queues:
        raise SendRefusedError("QUEUE_NOT_FOUND",
                               f"queue {qid} of {topic}, which has {cfg.read_queues} read queues")
    return cfg


def _check_readable(server: BrokerServer, topic: str, qid: int) -> None:
    """A pull's rules: one of the topic's read queues, and the topic readable; the half
    messages of open transactions are no consumer's to read."""
    if topic == HALF_TOPIC:
        raise SendRefusedError("NO_PERMISSION", f"{topic} holds uncommitted transactions")
    cfg = _queue_of(server, topic, qid)
    if cfg is not None and not cfg.readable:
        raise SendRefusedError("NO_PERMISSION", f"{topic} is not readable (perm {cfg.perm})")


# -- the handlers ---------------------------------------------------------------------------------

@handles(PULL, topic=readable_topic, queue_id=queue_id, offset=offset, max_messages=integer(),
         max_bytes=integer(), suspend_ms=integer(), tags=strings(PULL_TAGS_MAX))
async def pull(server: BrokerServer, topic: str, qid: int, start: int, max_messages: int,
               max_bytes: int, suspend_ms: int, tags: list[str]) -> list[Any]:
    _check_readable(server, topic, qid)
    return await server.pull(topic, qid, start, max_messages, max_bytes, suspend_ms, tags)


@handles(PULL_SQL, topic=readable_topic, queue_id=queue_id, offset=offset, max_messages=integer(),
         max_bytes=integer(), suspend_ms=integer(), sql=sql_expression)
async def pull_sql(server: BrokerServer, topic: str, qid: int, start: int, max_messages: int,
                   max_bytes: int, suspend_ms: int, sql: SqlFilter) -> list[Any]:
    _check_readable(server, topic, qid)
    return await server.pull(topic, qid, start, max_messages, max_bytes, suspend_ms, ["*"], sql)


@handles(TOPIC_PUT, name=user_topic, read_queues=integer(0, MAX_QUEUES),
         write_queues=integer(0, MAX_QUEUES), perm=integer(0, 7))
async def topic_put(server: BrokerServer, name: str, read_queues: int, write_queues: int,
                    perm: int) -> str:
    validate_config(TopicConfig(name, read_queues, write_queues, perm))  # perm 2, 4 or 6
    return (await server.leader_commit(TopicPut(name, read_queues, write_queues, perm))).status


@handles(TOPIC_DELETE, name=user_topic)
async def topic_delete(server: BrokerServer, name: str) -> str:
    return (await server.leader_commit(TopicDelete(name))).status


@handles(OFFSET_COMMIT, group=text(), topic=readable_topic, queue_id=queue_id, offset=offset)
async def offset_commit(server: BrokerServer, group: str, topic: str, qid: int,
                        committed: int) -> str:
    await server.node.read_barrier()  # the leader's topics include every earlier commit
    if _queue_of(server, topic, qid) is None:
        raise SendRefusedError("TOPIC_NOT_FOUND", topic)
    return (await server.leader_commit(OffsetCommit(group, topic, qid, committed))).status


@handles(OFFSET_QUERY, group=text(), topic=readable_topic, queue_id=queue_id)
async def offset_query(server: BrokerServer, group: str, topic: str, qid: int) -> int:
    await server.node.read_barrier()  # the leader, with every earlier commit applied
    return server.state.offsets.get((group, topic, qid), -1)


@handles(SEARCH_OFFSET, topic=readable_topic, queue_id=queue_id, timestamp_ms=integer())
async def search_offset(server: BrokerServer, topic: str, qid: int, timestamp_ms: int) -> int:
    return server.state.offset_at(topic, qid, timestamp_ms)


@handles(BROKER_STATUS)
async def broker_status(server: BrokerServer) -> dict[str, Any]:
    return server.status()


@handles(TRANSFER_LEADERSHIP, node_id=text())
async def transfer_leadership(server: BrokerServer, node_id: str) -> bool:
    voters = server.node.membership_status()["voters"]
    assert isinstance(voters, list)
    if node_id not in voters:
        raise BadRequestError(f"transfer_leadership: {node_id!r} is not a voter of group "
                              f"{server.group} ({', '.join(voters)})")
    server.require_leader()
    await server.node.transfer_leadership(node_id)
    return True


@handles(HEARTBEAT, client_id=text(), group=text(), model=one_of(*MODELS),
         subscriptions=subscriptions, ttl_ms=integer())  # members clamp the ttl
async def heartbeat(server: BrokerServer, client_id: str, group: str, model: str,
                    subs: dict[str, str], ttl_ms: int) -> list[str]:
    return server.heartbeat(client_id, group, model, subs, ttl_ms / 1000)


@handles(SEND_BACK, group=text(), topic=readable_topic, queue_id=queue_id, offset=offset,
         delay_level=integer(-1, 1024), max_reconsume_times=integer(0, MAX_RECONSUME_TIMES_LIMIT))
async def send_back(server: BrokerServer, group: str, topic: str, qid: int, at: int,
                    delay_level: int, max_reconsume_times: int) -> list[Any]:
    return await server.retries.send_back(group, topic, qid, at, delay_level, max_reconsume_times)


@handles(DLQ_RESEND, group=text(), offset=offset)
async def dlq_resend(server: BrokerServer, group: str, at: int) -> list[Any]:
    return await server.retries.resend_dead_letter(group, at)


@handles(LOCK_BATCH, group=text(), client_id=text(), queues=lock_queues)
async def lock_batch(server: BrokerServer, group: str, client_id: str,
                     queues: list[tuple[str, int]]) -> list[list[object]]:
    return await server.locks.lock(group, client_id, queues)


@handles(UNLOCK_BATCH, group=text(), client_id=text(), queues=lock_queues)
async def unlock_batch(server: BrokerServer, group: str, client_id: str,
                       queues: list[tuple[str, int]]) -> bool:
    return await server.locks.unlock(group, client_id, queues)


# Feature modules' request kinds join the table here, so that importing the table imports them
# all (each module imports this one's checks: it comes last).
from broker.features.txn import handlers as _txn_handlers  # noqa: E402,F401
from broker.features.query import handlers as query_handlers  # noqa: E402,F401 - message query (kinds 120-122)
from broker.features.admin import handlers as admin_handlers  # noqa: E402,F401 - consumer-group admin (124-126)
from broker.features.membership import handlers as member_handlers  # noqa: E402,F401 - the group's membership (127-129)
from broker.features.pop import handlers as pop_handlers  # noqa: E402,F401 - pop consumption (130-133)
from broker.features.acl import service as acl_service  # noqa: E402,F401 - access control (134-136)
