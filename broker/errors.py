"""Named errors of the broker's state machine and its entry codec."""

from __future__ import annotations


class BrokerError(Exception):
    """Base of the broker's errors."""


class InvalidTopicError(BrokerError):
    """A topic name breaks the naming rules, or names a reserved system topic."""


class BadEntryError(BrokerError):
    """A log entry's payload is not a valid broker entry."""
