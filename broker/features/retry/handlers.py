"""The requests of retry and dead letters: SEND_BACK (a consumer's failed message to its group's
retry or dead-letter topic) and DLQ_RESEND (an operator's resend of a dead letter), each field
checked before the retry service (``broker.features.retry.service``) is called."""

from __future__ import annotations

from typing import Any, Protocol

from broker.core.requests import Handler, handlers, integer, offset, queue_id, readable_topic, text
from broker.features.retry.service import RetryService
from protocol.broker_kinds import DLQ_RESEND, SEND_BACK
from protocol.consume_rules import MAX_RECONSUME_TIMES_LIMIT

__all__ = ["HANDLERS", "dlq_resend", "send_back"]

HANDLERS: list[Handler] = []
handles = handlers(HANDLERS)


class RetryHandlersHost(Protocol):
    @property
    def retries(self) -> RetryService: ...


@handles(SEND_BACK, group=text(), topic=readable_topic, queue_id=queue_id, offset=offset,
         delay_level=integer(-1, 1024), max_reconsume_times=integer(0, MAX_RECONSUME_TIMES_LIMIT))
async def send_back(broker: RetryHandlersHost, group: str, topic: str, qid: int, at: int,
                    delay_level: int, max_reconsume_times: int) -> list[Any]:
    return await broker.retries.send_back(group, topic, qid, at, delay_level, max_reconsume_times)


@handles(DLQ_RESEND, group=text(), offset=offset)
async def dlq_resend(broker: RetryHandlersHost, group: str, at: int) -> list[Any]:
    return await broker.retries.resend_dead_letter(group, at)
