"""Per-message time to live: the ``TTL_MS`` property (a user property on every path: our
client's ``Message(ttl_ms=...)``, a gRPC or 4.x remoting message property of that name).
RocketMQ 5 has no per-message TTL; NATS 2.11 has one (its ``Nats-TTL`` header); ours is in
milliseconds, the unit of RocketMQ's other time properties (``TIMER_DELAY_MS``).

A message with a TTL has expired once its store time plus the TTL is before now. Which clock
says now is the reader's: the node answering a pull (any replica) or the leader planning a pop
(whose decision, a message skipped, is then replicated in the pop entry); the state machine
never reads a clock and decides nothing about expiry. An expired message stays in the log
and its consume queue, is passed over by every read (its offset consumed like a filtered
one) and is reclaimed by retention as any message.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from protocol.int_property import int_property

TTL_PROPERTY = "TTL_MS"
TTL_MS_MAX = 366 * 86_400_000  # a year: anything longer is a mistake, not a TTL


class BadTtlError(ValueError):
    """A ``TTL_MS`` value that is not a positive integer of milliseconds up to ``TTL_MS_MAX``."""


def parse_ttl_ms(value: object) -> int:
    """A TTL property's value checked: a decimal integer 1..TTL_MS_MAX (``BadTtlError``
    naming the property otherwise)."""
    ttl_ms = int_property(value)
    if ttl_ms is None:
        raise BadTtlError(f"{TTL_PROPERTY} must be an integer of milliseconds, not {value!r}")
    if ttl_ms <= 0:
        raise BadTtlError(f"{TTL_PROPERTY} must be positive, not {ttl_ms}")
    if ttl_ms > TTL_MS_MAX:
        raise BadTtlError(f"{TTL_PROPERTY} {ttl_ms} is more than the maximum {TTL_MS_MAX} "
                          f"(366 days)")
    return ttl_ms


def ttl_of(properties: Iterable[Sequence[str]]) -> int | None:
    """The message's TTL in ms, None without one (or with a malformed one stored by an older
    broker, which never expires)."""
    for pair in properties:
        if pair[0] == TTL_PROPERTY:
            try:
                return parse_ttl_ms(pair[1])
            except BadTtlError:
                return None
    return None


def expired(properties: Iterable[Sequence[str]], store_ts_ms: int, now_ms: int) -> bool:
    """Whether a message stored at ``store_ts_ms`` with these properties has expired at
    ``now_ms`` (never, without a TTL)."""
    ttl_ms = ttl_of(properties) if properties else None
    return ttl_ms is not None and store_ts_ms + ttl_ms < now_ms


__all__ = ["TTL_MS_MAX", "TTL_PROPERTY", "BadTtlError", "expired", "parse_ttl_ms", "ttl_of"]
