"""Message priority, RocketMQ 5.4's: the ``PRIORITY`` property of a normal message (our
client's ``Message(priority=...)``; the official 5.x clients' PRIORITY message type, whose
system property the gRPC endpoint stores under this name). 0 (the default, no property) is the
lowest, ``PRIORITY_MAX`` the highest. Within a queue a pop consumer receives the higher
priorities first (``broker.features.pop.service``); equal priorities keep send order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from protocol.int_property import int_property

PRIORITY_PROPERTY = "PRIORITY"
PRIORITY_MAX = 9


class BadPriorityError(ValueError):
    """A ``PRIORITY`` value that is not an integer 0..PRIORITY_MAX."""


def parse_priority(value: object) -> int:
    """A priority checked: an integer 0..PRIORITY_MAX, as an int or its decimal text."""
    priority = int_property(value)
    if priority is None or not 0 <= priority <= PRIORITY_MAX:
        raise BadPriorityError(f"{PRIORITY_PROPERTY} must be an integer 0..{PRIORITY_MAX}, "
                               f"not {value!r}")
    return priority


def priority_of(properties: Iterable[Sequence[str]]) -> int:
    """A stored message's priority (0 without one, or with a malformed one)."""
    for pair in properties:
        if pair[0] == PRIORITY_PROPERTY:
            try:
                return parse_priority(pair[1])
            except BadPriorityError:
                return 0
    return 0


__all__ = ["PRIORITY_MAX", "PRIORITY_PROPERTY", "BadPriorityError", "parse_priority",
           "priority_of"]
