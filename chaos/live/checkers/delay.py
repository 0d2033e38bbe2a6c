"""The delayed-message checker: reads what producers were told (each acknowledged delayed message
and the time it is due) and what the queues hold at the end (every message read back from
every queue, with its store time), and names each violation:

- early: a message stored in its queue before its due time (the ``TIMER_DELIVER_MS`` the
  leader set, which the delivered copy carries);
- twice: one acknowledged message (by its unique key) stored more than once in its queues;
- lost: an acknowledged message not in any queue although nothing is pending any more.

Pure: the caller reads the cluster; this only judges. Used by the live chaos suite and the
process tests, each with the canaries that must make it fire (``delay_early``,
``timer_redeliver``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Delivered:
    msg_id: str  # the unique key the producer was given
    queue: str  # group/topic/queue id, for the report
    offset: int
    store_ts_ms: int
    due_ms: int  # TIMER_DELIVER_MS as delivered (-1: the property is missing)


def check_delayed(acked: dict[str, int], delivered: Iterable[Delivered],
                  nothing_pending: bool) -> list[str]:
    """Violations, worst first; ``acked`` maps each acknowledged message id to its due time
    (as the producer computed or was told it, used only for messages missing a due property)."""
    seen = list(delivered)
    problems: list[str] = []
    for d in seen:
        due = d.due_ms if d.due_ms >= 0 else acked.get(d.msg_id, -1)
        if due < 0:
            continue
        if d.store_ts_ms < due:
            problems.append(f"early: {d.msg_id} stored in {d.queue}@{d.offset} at "
                            f"{d.store_ts_ms}, due {due} ({due - d.store_ts_ms} ms early)")
    counts = Counter(d.msg_id for d in seen)
    for msg_id, n in sorted(counts.items()):
        if n > 1 and msg_id in acked:
            where = ", ".join(f"{d.queue}@{d.offset}" for d in seen if d.msg_id == msg_id)
            problems.append(f"twice: {msg_id} stored {n} times ({where})")
    if nothing_pending:
        lost = sorted(set(acked) - set(counts))
        if lost:
            problems.append(f"lost: {len(lost)} acknowledged delayed messages in no queue "
                            f"(first: {', '.join(lost[:5])})")
    return problems
