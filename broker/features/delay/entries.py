"""The delay feature's log entries (``broker.features.delay.model``), strictly decoded:
TIMER_DELIVER (kind 6) ``[ts, auto_create, default_queues, [[schedule offset, due ms, real topic,
real queue id, message]...]]``, the delay service's delivery, and TIMER_RECALL (kind 22) ``[ts,
schedule offset, due ms, real topic, message id]``, a producer's recall of a pending delayed
message. Delayed messages themselves are stored by ordinary sends to the schedule topic (the
leader's rewrite, ``model.route_run``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.core.codec import as_bool, as_int, as_str, check_message, dump

__all__ = ["KIND_TIMER_DELIVER", "KIND_TIMER_RECALL", "TimerDeliver", "TimerRecall",
           "decode_timer_deliver", "decode_timer_recall", "encode_timer_deliver",
           "encode_timer_recall", "timer_messages"]

KIND_TIMER_DELIVER = 6
KIND_TIMER_RECALL = 22


@dataclass(frozen=True, slots=True)
class TimerDeliver:
    """The delay service's delivery of due timers (``broker.features.delay.model``): per timer
    its schedule queue offset and due time (which name it in the index), its real topic and
    queue, and the message copy to store there. A timer no longer pending is skipped at apply."""

    store_ts_ms: int  # the leader's clock when it proposed the entry: never before a due time
    items: tuple[tuple[int, int, str, int, list[Any]], ...]
    auto_create: bool = False
    default_queues: int = 4


def encode_timer_deliver(e: TimerDeliver) -> bytes:
    return dump(KIND_TIMER_DELIVER, [e.store_ts_ms, e.auto_create, e.default_queues,
                                     [list(item) for item in e.items]])


def decode_timer_deliver(number: int, f: list[Any]) -> TimerDeliver:
    ts, auto_create, default_queues, items = f
    if not isinstance(items, list) or not items:
        raise ValueError("a delivery carries at least one timer")
    out = []
    for item in items:
        if type(item) is not list or len(item) != 5:
            raise ValueError("a delivered timer is [offset, due, topic, queue id, message]")
        offset, due, topic, queue_id, m = item
        check_message(m)
        out.append((as_int(offset), as_int(due), as_str(topic), as_int(queue_id), m))
    return TimerDeliver(as_int(ts), tuple(out), as_bool(auto_create), as_int(default_queues, 1))


def timer_messages(f: list[Any]) -> list[Any]:
    """A stored delivery's message copies by slot, from its fields."""
    return [item[4] for item in f[3]]


@dataclass(frozen=True, slots=True)
class TimerRecall:
    """A producer's recall of the delayed message whose timer is ``(due ms, schedule offset)``
    (RocketMQ 5.x's RecallMessage): the apply takes the timer out of the index, so the message
    is never delivered; a timer no longer pending (delivered, or recalled already) refuses it.
    ``topic`` and ``message_id`` name the message in the answer and in the log."""

    store_ts_ms: int
    offset: int
    due_ms: int
    topic: str
    message_id: str


def encode_timer_recall(e: TimerRecall) -> bytes:
    return dump(KIND_TIMER_RECALL, [e.store_ts_ms, e.offset, e.due_ms, e.topic, e.message_id])


def decode_timer_recall(number: int, f: list[Any]) -> TimerRecall:
    ts, offset, due, topic, message_id = f
    return TimerRecall(as_int(ts), as_int(offset), as_int(due), as_str(topic), as_str(message_id))
