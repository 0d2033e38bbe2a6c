"""The client library's exceptions: one hierarchy, retriable and non-retriable branches, and a
timeout whose commit outcome is unknown (docs/design.md)."""

from __future__ import annotations

from protocol.filter_sql import SqlFilter, SqlFilterError, compile_sql


class ClientError(Exception):
    """Base of every error the client library raises."""


class RetriableError(ClientError):
    """The same request may succeed later or elsewhere."""


class NotLeaderError(RetriableError):
    """The node is not its group's leader (the client follows the redirect by itself)."""


class NoLeaderYetError(RetriableError):
    """The group has no leader right now (an election is under way)."""


class UnavailableError(RetriableError):
    """No node of any group could take the request before the deadline."""


class StaleRouteError(UnavailableError):
    """The route names a group's nodes without its current leader (it is still registering):
    refresh the route and retry."""


class OverloadedError(RetriableError):
    """The leader has too many proposals pending."""


class NonRetriableError(ClientError):
    """Retrying the same request cannot succeed."""


class TlsError(NonRetriableError):
    """A TLS handshake with a NameServer or a broker failed: its certificate is not signed by
    the CA given (``tls_ca=`` or ``DLEDGER_TLS_CA``; none given: the system's trust store) or
    does not name the host dialed, or the server does not speak TLS (docs/tls.md)."""


class MessageTooLargeError(NonRetriableError):
    """A message or a batch exceeds the broker's size limits."""


class TopicNotFoundError(NonRetriableError):
    """No group serves the topic (and auto-create is off)."""


class NoPermissionError(NonRetriableError):
    """The topic's permission forbids the operation (perm 2, 4 or 6)."""


class BadDelayError(NonRetriableError):
    """The broker cannot schedule a delayed message: a malformed delay, one beyond its maximum,
    or delayed messages in a batch."""


class BadFilterError(NonRetriableError, ValueError):
    """A malformed SQL92 filter expression (``subscribe(topic, sql=...)``): ``offset`` is the
    0-based character offset at which it goes wrong."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


def compile_filter(sql: str) -> SqlFilter:
    """``sql`` compiled as the broker will (``protocol.filter_sql``); BadFilterError if malformed."""
    try:
        return compile_sql(sql)
    except SqlFilterError as err:
        raise BadFilterError(str(err), err.offset) from None


class BadTransactionError(NonRetriableError):
    """A transactional message the broker will not take: delayed, or in a batch (RocketMQ's
    rules), or a transaction id or producer group that is malformed."""


class TransactionError(NonRetriableError):
    """A transaction cannot end as asked: ``status`` says why (TXN_NOT_FOUND: no such open
    transaction of this producer group; TXN_ALREADY_DECIDED: it ended the other way;
    OFFSET_CONFLICT: a pipeline's consumer offsets moved since it read them, so it rolled
    back)."""

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status


class InvalidTopicError(NonRetriableError):
    """The topic name breaks the naming rules or is reserved."""


class ClientNotStartedError(NonRetriableError):
    """The producer or consumer was used before ``start()`` (or outside its ``async with``)."""


class ClientClosedError(NonRetriableError):
    """The producer or consumer was used after ``close()``; a closed client cannot restart."""


class OffsetStoreError(NonRetriableError):
    """A broadcasting consumer's local offset file cannot be read or written."""


class OffsetStoreLockedError(OffsetStoreError):
    """Another consumer (in this process or another) holds the same offset file: same group,
    client id and directory. Give each broadcasting consumer its own ``client_id``."""


class ConsumerGroupActiveError(NonRetriableError):
    """A consumer group's offsets were not reset: live members consume the topic and would
    overwrite the reset with their own progress (stop them first, or force it)."""


class SendTimeoutError(ClientError):
    """The deadline passed before the send was known to be committed: it may or may not be
    stored. (A retry with the same message reuses its unique key, so the broker stores it once.)"""


class MessageNotFoundError(NonRetriableError):
    """No message is stored under that offset msg id (``MessageQuery.view``): never stored, a
    refused duplicate, or deleted since by log retention or with its topic."""


class ClientNotConnectedError(NonRetriableError):
    """The consumer asked about (``ask_consumer``) is connected to no node that could ask it:
    not running, not of that group, or of a protocol the broker cannot ask (our own)."""


class ClientNoAnswerError(NonRetriableError):
    """The consumer asked about did not answer in time, or refused (its remark says why)."""


class AccessDeniedError(NonRetriableError):
    """The cluster's access control refused the request: the account lacks the permission it
    needs on the topic or group (PUB to send, SUB to consume), or it is an admin operation."""


class SignatureError(NonRetriableError):
    """The cluster's access control refused the request's signature: none given (the cluster
    needs credentials), an unknown access key, a wrong secret, a clock too far from the
    broker's, or a replayed request."""
