"""Consumer groups' settings, the pure part: what an operator set for a consumer group, kept by
each broker group (RocketMQ's subscription group config, which each broker keeps too),
replicated through the log so that every leader knows it.

A group's retry policy, as RocketMQ 5 keeps it: ``max_delivery_attempts``, how many times a
message is delivered to the group before it goes to the group's dead-letter queue
(``%DLQ%<group>``). RocketMQ stores it as ``retryMaxTimes`` (the retries after the first
delivery) and gives a RocketMQ 5 client ``retryMaxTimes + 1`` as its settings'
``backoff_policy.max_attempts``; this table keeps the attempts themselves. A group with no
setting takes the broker's ``--grpc-max-delivery-attempts``. Used on the gRPC path (the dead-
letter decision of a receive, ``broker.features.pop.service``, and the settings a client is
told, ``broker.frontends.grpc.gateway``).

Pure and deterministic: changed only by ``SubscriptionGroupPut`` entries
(``broker.features.admin.entries``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol.consume_rules import MAX_RECONSUME_TIMES_LIMIT

__all__ = ["ATTEMPTS_MAX", "GROUPS_MAX", "GROUP_MAX_CHARS", "SubscriptionGroup",
           "SubscriptionGroups", "check_attempts"]

ATTEMPTS_MAX = MAX_RECONSUME_TIMES_LIMIT  # the most delivery attempts a group may be given
GROUPS_MAX = 100_000  # consumer groups with a setting, per broker group
GROUP_MAX_CHARS = 255  # a consumer group's name (as every request's: broker.core.requests)


def check_attempts(v: Any) -> int | None:
    """A group's maximum delivery attempts: 1..``ATTEMPTS_MAX``, or None (the broker's
    default); ValueError saying why otherwise."""
    if v is None:
        return None
    if type(v) is not int or not 1 <= v <= ATTEMPTS_MAX:
        raise ValueError(f"max delivery attempts must be an integer in 1..{ATTEMPTS_MAX} "
                         f"(or none: the broker's default), not {v!r}")
    return v


@dataclass(frozen=True, slots=True)
class SubscriptionGroup:
    max_delivery_attempts: int


class SubscriptionGroups:
    __slots__ = ("_groups",)

    def __init__(self) -> None:
        self._groups: dict[str, SubscriptionGroup] = {}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubscriptionGroups) and self._groups == other._groups

    def __len__(self) -> int:
        return len(self._groups)

    def put(self, group: str, max_delivery_attempts: int | None) -> str:
        """Set (or, with None, clear) the group's setting: the apply's status (OK, or
        TOO_MANY_GROUPS when the table is full and the group is new)."""
        if max_delivery_attempts is None:
            self._groups.pop(group, None)
            return "OK"
        if group not in self._groups and len(self._groups) >= GROUPS_MAX:
            return "TOO_MANY_GROUPS"
        self._groups[group] = SubscriptionGroup(max_delivery_attempts)
        return "OK"

    def get(self, group: str) -> SubscriptionGroup | None:
        return self._groups.get(group)

    def max_delivery_attempts(self, group: str, default: int) -> int:
        """The group's maximum delivery attempts, else ``default`` (the broker's)."""
        g = self._groups.get(group)
        return g.max_delivery_attempts if g is not None else default

    def groups(self) -> list[tuple[str, SubscriptionGroup]]:
        return sorted(self._groups.items())

    def snapshot(self) -> list[Any]:
        return [[g, s.max_delivery_attempts] for g, s in self.groups()]

    @classmethod
    def restore(cls, blob: Any) -> SubscriptionGroups:
        table = cls()
        if not isinstance(blob, list):
            raise ValueError("malformed subscription groups")
        for row in blob:
            if type(row) is not list or len(row) != 2 or not isinstance(row[0], str):
                raise ValueError("malformed subscription group")
            attempts = check_attempts(row[1])
            if attempts is None:
                raise ValueError("a subscription group without its setting")
            table._groups[row[0]] = SubscriptionGroup(attempts)
        return table
