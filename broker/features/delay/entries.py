"""The delay service's log entry (``broker.features.delay.model``): TIMER_DELIVER (kind 6)
``[ts, auto_create, default_queues, [[schedule offset, due ms, real topic, real queue id,
message]...]]``, strictly decoded. Delayed messages themselves are stored by ordinary sends to the
schedule topic (the leader's rewrite, ``model.route_run``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.core.codec import as_bool, as_int, as_str, check_message, dump

__all__ = ["KIND_TIMER_DELIVER", "TimerDeliver", "decode_timer_deliver", "encode_timer_deliver",
           "timer_messages"]

KIND_TIMER_DELIVER = 6


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
