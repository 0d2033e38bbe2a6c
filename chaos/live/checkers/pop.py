"""The checker of pop consumption (RocketMQ 5 clients at the gRPC endpoint,
``broker.features.pop.model``) over a recorded history: what the producers were told was sent, what
the consumers received (when each receive call began), and which acks the brokers acknowledged (when
each ack returned).

Judged:
- loss: a send acknowledged to its producer never received by the group;
- redelivery after ack: a message received by a receive call that began after an ack of that
  message had been acknowledged (an ack is answered only once its entry is applied, so no later
  receive may return the message: ``broker.features.pop.model``'s guarantee);
- and counted, not judged: deliveries beyond the first of a message whose ack had not been
  acknowledged yet (invisible times ending, lost answers): RocketMQ's at-least-once.

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


@dataclass(frozen=True, slots=True)
class Ack:
    message_id: str
    acked_s: float  # monotonic, when the broker's answer arrived


@dataclass
class PopVerdict:
    sent: int
    received: int
    redelivered: int  # deliveries beyond a message's first, of unacked messages (allowed)
    lost: list[str] = field(default_factory=list)
    after_ack: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.lost and not self.after_ack

    def lines(self) -> list[str]:
        out = [f"pop: acknowledged send {m} never received" for m in self.lost[:LINES_MAX]]
        out += [f"pop: {line}" for line in self.after_ack[:LINES_MAX]]
        return out


def check_pop(sent: set[str], deliveries: list[Delivery], acks: list[Ack]) -> PopVerdict:
    first_ack: dict[str, float] = {}
    for a in acks:
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
    return PopVerdict(len(sent), len(seen), redelivered, lost, after_ack)


__all__ = ["Ack", "Delivery", "PopVerdict", "check_pop"]
