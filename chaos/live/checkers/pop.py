"""The checker of pop consumption and FIFO (RocketMQ 5 clients at the gRPC endpoint,
``broker.features.pop.model``) over a recorded history: what the producers were told was sent,
what the consumers received (when each receive call began and returned), and the acks they sent
(when each was sent, when its answer came, and whether the broker acknowledged it).

Judged:
- loss: a send acknowledged to its producer never received by the group;
- redelivery after ack: a message received by a receive call that began after an ack of that
  message had been acknowledged (an ack is answered only once its entry is applied, so no later
  receive may return the message: ``broker.features.pop.model``'s guarantee);
- FIFO, for deliveries that name their message group and their place in its send order:
  *overlap*, two messages of one group in flight at once, and *order*, a group's message first
  handed out before an earlier one of its group;
- and counted, not judged: deliveries beyond the first of a message whose ack had not been
  acknowledged yet (invisible times ending, lost answers): RocketMQ's at-least-once; and FIFO's
  *parallel* deliveries, messages handed out while a message of another group was in flight.

The FIFO verdicts hold only what the times prove, never a guess. A message is in flight from
its hand-out, no later than its first receive returned, until its ack is applied, no earlier
than its first ack was sent (succeeded or not: a failed ack's answer may be all that was lost).
So two messages were in flight together for certain when each was received before the other's
first ack was sent; a message handed out for certain before another when its receive returned
before the other's began. Messages never acked are left out of these (a dead letter also
leaves flight, unseen): the runs judged ack every message they receive.

Pure: the history is data; the test or the chaos run records it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LINES_MAX = 10


@dataclass(frozen=True, slots=True)
class Delivery:
    message_id: str
    receive_began_s: float  # monotonic, when the receive call that returned it began
    attempt: int  # the delivery attempt the broker gave
    receive_ended_s: float | None = None  # monotonic, when that call returned (FIFO)
    group: str = ""  # its message group ("": none, not judged as FIFO)
    seq: int = -1  # its place in its group's send order


@dataclass(frozen=True, slots=True)
class Ack:
    message_id: str
    acked_s: float  # monotonic, when the broker's answer arrived
    sent_s: float | None = None  # monotonic, when the ack was sent (FIFO)
    ok: bool = True  # the broker acknowledged it (False: refused, or no answer)


@dataclass
class PopVerdict:
    sent: int
    received: int
    redelivered: int  # deliveries beyond a message's first, of unacked messages (allowed)
    lost: list[str] = field(default_factory=list)
    after_ack: list[str] = field(default_factory=list)
    overlap: list[str] = field(default_factory=list)  # two of one group in flight at once
    disorder: list[str] = field(default_factory=list)  # a group's messages out of send order
    parallel_s: list[float] = field(default_factory=list)  # when a message went out beside
    # one of another group in flight (FIFO's groups proceeding at once), each such receive's end

    @property
    def ok(self) -> bool:
        return not self.lost and not self.after_ack and not self.overlap and not self.disorder

    def lines(self) -> list[str]:
        out = [f"pop: acknowledged send {m} never received" for m in self.lost[:LINES_MAX]]
        out += [f"pop: {line}" for line in self.after_ack[:LINES_MAX]]
        out += [f"fifo: overlap: {line}" for line in self.overlap[:LINES_MAX]]
        out += [f"fifo: order: {line}" for line in self.disorder[:LINES_MAX]]
        return out


def check_pop(sent: set[str], deliveries: list[Delivery], acks: list[Ack]) -> PopVerdict:
    first_ack: dict[str, float] = {}
    for a in acks:
        if a.ok:
            first_ack[a.message_id] = min(a.acked_s, first_ack.get(a.message_id, a.acked_s))
    seen: dict[str, int] = {}
    after_ack = []
    for d in sorted(deliveries, key=lambda d: d.receive_began_s):
        acked_at = first_ack.get(d.message_id)
        if acked_at is not None and d.receive_began_s > acked_at:
            after_ack.append(f"{d.message_id} received (attempt {d.attempt}) by a receive that "
                             f"began {d.receive_began_s - acked_at:.3f} s after its ack")
        seen[d.message_id] = seen.get(d.message_id, 0) + 1
    redelivered = sum(n - 1 for n in seen.values())
    lost = sorted(m for m in sent if m not in seen)
    verdict = PopVerdict(len(sent), len(seen), redelivered, lost, after_ack)
    _check_fifo(verdict, deliveries, acks)
    return verdict


@dataclass(frozen=True, slots=True)
class _Window:
    """One message's time in flight as the history bounds it."""

    message_id: str
    group: str
    seq: int
    began_s: float  # its first receive began: handed out no earlier
    out_s: float  # its first receive returned: handed out no later
    acked_from_s: float  # its first ack was sent: in flight at least until then


def _windows(deliveries: list[Delivery], acks: list[Ack]) -> list[_Window]:
    ack_sent: dict[str, float] = {}
    for a in acks:
        if a.sent_s is not None:
            ack_sent[a.message_id] = min(a.sent_s, ack_sent.get(a.message_id, a.sent_s))
    first: dict[str, Delivery] = {}
    for d in deliveries:
        if d.group and d.receive_ended_s is not None and d.message_id in ack_sent:
            old = first.get(d.message_id)
            if old is None or d.receive_began_s < old.receive_began_s:
                first[d.message_id] = d
    return sorted((_Window(m, d.group, d.seq, d.receive_began_s, d.receive_ended_s or 0.0,
                           ack_sent[m]) for m, d in first.items()), key=lambda w: w.out_s)


def _check_fifo(verdict: PopVerdict, deliveries: list[Delivery], acks: list[Ack]) -> None:
    windows = _windows(deliveries, acks)
    # in order of hand-out (bounded above): the latest ack-send of earlier messages, per group
    open_until: dict[str, _Window] = {}
    for w in windows:
        prev = open_until.get(w.group)
        if prev is not None and w.out_s < prev.acked_from_s:
            verdict.overlap.append(
                f"group {w.group}: {w.message_id} (#{w.seq}) handed out while {prev.message_id} "
                f"(#{prev.seq}) was in flight (its ack sent {prev.acked_from_s - w.out_s:.3f} s "
                f"after the second was received)")
        if any(g != w.group and o.acked_from_s > w.out_s for g, o in open_until.items()):
            verdict.parallel_s.append(w.out_s)
        if prev is None or w.acked_from_s > prev.acked_from_s:
            open_until[w.group] = w
    by_group: dict[str, list[_Window]] = {}
    for w in windows:
        by_group.setdefault(w.group, []).append(w)
    for group, ws in sorted(by_group.items()):
        for later in ws:
            early = [w for w in ws if w.seq < later.seq and later.out_s < w.began_s]
            if early:
                verdict.disorder.append(
                    f"group {group}: #{later.seq} ({later.message_id}) handed out before "
                    f"#{early[0].seq} ({early[0].message_id})")


__all__ = ["Ack", "Delivery", "PopVerdict", "check_pop"]
