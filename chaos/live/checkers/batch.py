"""The batch checker: a batch (several messages of one send: SEND, a RocketMQ 5 client's
SendMessage with several messages) is stored all or nothing. Reads what the producers sent (each
batch's message ids, in order, and whether its send was acknowledged) and what the queues hold
at the end (every message read back, with its queue and offset), and names each violation:

- torn: some of a batch's messages stored and others not;
- scattered: a batch stored across queues, or not at contiguous offsets in send order;
- twice: a message of a batch stored more than once (a retried batch is deduplicated);
- lost: an acknowledged batch not stored at all.

A batch whose send was not acknowledged (an unknown outcome) may be wholly present or wholly
absent. Pure: the caller reads the cluster; this only judges. Used by the gRPC endpoint's live
test (a leader killed under batch sends), with the canary ``grpc_batch_torn`` that must make
it fire.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

LINES_MAX = 10


@dataclass(frozen=True, slots=True)
class Stored:
    message_id: str  # the unique key its producer gave it
    queue: str  # group/topic/queue id
    offset: int


@dataclass
class BatchVerdict:
    batches: int
    acked: int
    present: int  # batches wholly stored
    torn: list[str] = field(default_factory=list)
    scattered: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.torn or self.scattered or self.twice or self.lost)

    def lines(self) -> list[str]:
        out: list[str] = []
        for name in ("torn", "scattered", "twice", "lost"):
            out += [f"batch {name}: {line}" for line in getattr(self, name)[:LINES_MAX]]
        return out


def check_batches(batches: dict[str, list[str]], acked: set[str],
                  stored: Iterable[Stored]) -> BatchVerdict:
    """``batches``: batch id -> its message ids in send order; ``acked``: the ids of the
    batches whose send was acknowledged; ``stored``: every message the queues hold."""
    where: dict[str, list[Stored]] = defaultdict(list)
    for s in stored:
        where[s.message_id].append(s)
    v = BatchVerdict(len(batches), len(acked & set(batches)), 0)
    for batch_id, ids in sorted(batches.items()):
        copies = [where.get(m, []) for m in ids]
        found = sum(1 for c in copies if c)
        if found == 0:
            if batch_id in acked:
                v.lost.append(f"{batch_id} ({len(ids)} messages) acknowledged, none stored")
            continue
        if found < len(ids):
            missing = [m for m, c in zip(ids, copies) if not c]
            v.torn.append(f"{batch_id}: {found} of {len(ids)} stored (missing "
                          f"{', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
            continue
        many = [m for m, c in zip(ids, copies) if len(c) > 1]
        if many:
            v.twice.append(f"{batch_id}: {len(many)} messages stored more than once "
                           f"(first {many[0]}: {len(where[many[0]])} times)")
            continue
        places = [c[0] for c in copies]
        queues = {p.queue for p in places}
        offsets = [p.offset for p in places]
        if len(queues) > 1 or offsets != list(range(offsets[0], offsets[0] + len(ids))):
            v.scattered.append(f"{batch_id}: stored at "
                               f"{', '.join(f'{p.queue}@{p.offset}' for p in places[:4])}"
                               f"{', ...' if len(places) > 4 else ''}")
            continue
        v.present += 1
    return v


__all__ = ["BatchVerdict", "Stored", "check_batches"]
