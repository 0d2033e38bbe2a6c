"""The request table's transaction kinds (``broker.core.requests``): TXN_HALF, END_TRANSACTION and
PRODUCER_HEARTBEAT, each field checked before the transaction service (``broker.features.txn.service``)
is called (``broker.api.table`` puts ``HANDLERS`` in the request table)."""

from __future__ import annotations

from typing import Any, Protocol

from broker.core.requests import (
    ID_MAX_CHARS,
    Handler,
    brief,
    handlers,
    integer,
    one_of,
    queue_id,
    readable_topic,
    text,
    user_topic,
)
from broker.features.txn.model import COMMIT, HALVES_MAX, ROLLBACK, TXN_ID_MAX_CHARS
from broker.features.txn.service import TxnService
from protocol.broker_kinds import END_TRANSACTION, PRODUCER_HEARTBEAT, TXN_HALF

HANDLERS: list[Handler] = []
handles = handlers(HANDLERS)


class TxnHandlersHost(Protocol):
    @property
    def txns(self) -> TxnService: ...

OFFSETS_MAX = 1024  # consumer offsets committed with one transaction


def offsets(v: Any) -> list[tuple[str, str, int, int, int]]:
    """An END's ``[[group, topic, queue id, expected, new], ...]``."""
    if type(v) is not list or len(v) > OFFSETS_MAX:
        raise ValueError(f"must be a list of at most {OFFSETS_MAX} offsets, got {brief(v)}")
    out = []
    for o in v:
        if type(o) is not list or len(o) != 5:
            raise ValueError(f"an offset is [group, topic, queue id, expected, new], got "
                             f"{brief(o)}")
        out.append((text()(o[0]), readable_topic(o[1]), queue_id(o[2]), integer(-1)(o[3]),
                    integer()(o[4])))
    return out


def messages(v: Any) -> Any:
    """Half messages: a non-empty list (each checked as a send's by the service)."""
    if type(v) is not list or not 0 < len(v) <= HALVES_MAX:
        raise ValueError(f"must be a list of 1..{HALVES_MAX} messages, got {brief(v)}")
    return v


def flag(v: Any) -> bool:
    if type(v) is not bool:
        raise ValueError(f"must be true or false, got {brief(v)}")
    return v


@handles(TXN_HALF, producer_group=text(), transaction_id=text(TXN_ID_MAX_CHARS),
         topic=user_topic, queue_id=queue_id, messages=messages)
async def txn_half(broker: TxnHandlersHost, producer_group: str, txn_id: str, topic: str,
                   qid: int, raw: list[Any]) -> list[Any]:
    return await broker.txns.half(producer_group, txn_id, topic, qid, raw)


@handles(END_TRANSACTION, producer_group=text(), transaction_id=text(TXN_ID_MAX_CHARS),
         decision=one_of(COMMIT, ROLLBACK), from_check=flag, offsets=offsets)
async def end_transaction(broker: TxnHandlersHost, producer_group: str, txn_id: str, decision: str,
                          from_check: bool, committed: list[tuple[str, str, int, int, int]]
                          ) -> list[Any]:
    return await broker.txns.end(producer_group, txn_id, decision, from_check, committed)


@handles(PRODUCER_HEARTBEAT, with_connection=True, client_id=text(ID_MAX_CHARS),
         producer_group=text(), ttl_ms=integer())  # the producer table clamps the ttl
async def producer_heartbeat(broker: TxnHandlersHost, connection: Any, client_id: str, group: str,
                             ttl_ms: int) -> list[str]:
    return broker.txns.heartbeat(client_id, group, connection, ttl_ms / 1000)
