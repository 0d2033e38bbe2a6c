"""The orderly-consumption checker: reads a recorded history of processing (each listener call:
which member, which queue and offset, which order id and its sequence number, when it started
and ended, whether it succeeded) and names each violation:

- overlap: two members processing messages of one queue at the same instant;
- order: a message of an order id first processed successfully before the message sent just
  before it (an in-place retry, or a redelivery from the committed offset after a hand-over,
  repeats a message; neither breaks this);
- lost: a message the producer was told is stored never processed successfully.

Times are one host's clock (``time.monotonic_ns`` of processes on one machine are comparable:
CLOCK_MONOTONIC is system-wide). Pure; used by the process tests and the live chaos suite, with
the canaries ``lock_unfenced`` and ``lock_leader_local`` that must make it fire.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Processing:
    member: str
    queue: str
    offset: int
    order_id: str
    seq: int  # the message's place in its order id's sends, from 0
    start_ns: int
    end_ns: int
    ok: bool


def check_orderly(history: Iterable[Processing], acked: dict[str, int]) -> list[str]:
    """Violations; ``acked`` maps each order id to how many of its messages were acknowledged
    (its sequence numbers 0..n-1)."""
    events = list(history)
    problems: list[str] = []
    by_queue: dict[str, list[Processing]] = defaultdict(list)
    for e in events:
        by_queue[e.queue].append(e)
    for queue, calls in sorted(by_queue.items()):
        calls.sort(key=lambda e: e.start_ns)
        latest: Processing | None = None  # the call that ends last so far
        for e in calls:
            if latest is not None and e.member != latest.member and e.start_ns < latest.end_ns:
                problems.append(f"overlap: {queue}: {e.member} began offset {e.offset} "
                                f"{(latest.end_ns - e.start_ns) / 1e6:.1f} ms before "
                                f"{latest.member} finished offset {latest.offset}")
            if latest is None or e.end_ns > latest.end_ns:
                latest = e
    first_ok: dict[tuple[str, int], int] = {}
    for e in events:
        if e.ok:
            key = (e.order_id, e.seq)
            first_ok[key] = min(first_ok.get(key, e.end_ns), e.end_ns)
    for order_id, n in sorted(acked.items()):
        for seq in range(n):
            if (order_id, seq) not in first_ok:
                problems.append(f"lost: {order_id} message {seq} never processed successfully")
            elif seq and (order_id, seq - 1) in first_ok \
                    and first_ok[(order_id, seq)] < first_ok[(order_id, seq - 1)]:
                problems.append(f"order: {order_id} message {seq} processed before {seq - 1}")
    return problems
