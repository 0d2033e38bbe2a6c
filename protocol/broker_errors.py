"""Named errors of the broker's state machine and its entry codec."""

from __future__ import annotations


class BrokerError(Exception):
    """Base of the broker's errors; ``code`` names it on the wire."""

    code = "BROKER_ERROR"


class InvalidTopicError(BrokerError):
    """A topic name breaks the naming rules, or names a reserved system topic."""

    code = "INVALID_TOPIC"


class BadEntryError(BrokerError):
    """A log entry's payload is not a valid broker entry (or a request is malformed)."""

    code = "BAD_REQUEST"


class BadRequestError(BrokerError):
    """A request is malformed: an argument missing or extra, or a field of the wrong type or out
    of its range. The message names the request and the field."""

    code = "BAD_REQUEST"


class BadDelayError(BrokerError):
    """A delayed message the broker cannot schedule: a malformed level or time, one too far
    ahead, or delayed messages in a batch or beside immediate ones in one run."""

    code = "BAD_DELAY"


class BadTransactionError(BrokerError):
    """A transactional message the broker cannot take: delayed (RocketMQ's rule), or sent with
    a malformed transaction id or producer group."""

    code = "BAD_TRANSACTION"


class ClientNotConnectedError(BrokerError):
    """The client asked about is not connected to this node (or does not heartbeat here, or
    its protocol cannot be asked): try a node it heartbeats on."""

    code = "CLIENT_NOT_CONNECTED"


class ClientNoAnswerError(BrokerError):
    """The client asked did not answer in time, or answered with an error (named)."""

    code = "CLIENT_NO_ANSWER"


class MessageNotFoundError(BrokerError):
    """No stored message has that offset msg id here (never stored, a refused duplicate, or
    deleted by log retention or with its topic)."""

    code = "MESSAGE_NOT_FOUND"
