"""RocketMQ 5's gRPC protocol (``apache.rocketmq.v2``) and our messages: the pure half of the
gateway (``broker.frontends.grpc.gateway`` is the shell).

Owns:
- ``inbound``: a protocol ``Message`` checked field by field and turned into our send row
  (``[body, tags, keys, unique_key, [[name, value]...], born_ts_ms]``, ``protocol.broker_kinds``'s SEND)
  with its kind (NORMAL, FIFO, DELAY, TRANSACTION, PRIORITY) and message group. What the
  protocol says in system properties and we keep as properties uses RocketMQ's own names where
  it has one: the message group is ``__SHARDINGKEY``, the delivery time ``TIMER_DELIVER_MS``;
  the born host is ``__BORNHOST``, a PRIORITY message's priority ``PRIORITY``. The message
  id (the client's, kept across its retries) is the unique key the broker deduplicates by,
  so a retried send is stored once.
- ``outbound``: a message read from a queue as the protocol's ``Message`` (the same mapping
  back; the queue, offset, store time and delivery attempt filled in; the body's digest MD5 in
  upper-case hex, as RocketMQ's proxy gives it).
- status codes: ``GatewayError`` carries a protocol ``Code``; ``code_of`` maps the broker API's
  named errors (in process or forwarded), the log's and our client library's onto the codes a
  RocketMQ 5 client understands.

Pure: no sockets, no clock (times are passed in).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from rocketmq.grpc_protocol import definition_pb2 as pb

from client import errors
from protocol import broker_kinds as bp
from protocol.auth import AccessDeniedError, SignatureError
from protocol.broker_errors import BrokerError
from protocol.envelope import BadRequestError, RemoteError
from protocol.errors import (
    DiskFullError,
    OutcomeUnknownError,
    OverloadedError,
    ProposalError,
    WireError,
)
from protocol.group_client import UnavailableError
from protocol.int_property import natural
from protocol.priority import PRIORITY_MAX, PRIORITY_PROPERTY, priority_of

__all__ = [
    "PROP_BORN_HOST",
    "PROP_DELIVER_MS",
    "PROP_MESSAGE_GROUP",
    "SYSTEM_PROPERTY_NAMES",
    "GatewayError",
    "Inbound",
    "code_of",
    "guarded",
    "inbound",
    "outbound",
    "status",
    "status_code",
]

PROP_MESSAGE_GROUP = "__SHARDINGKEY"  # RocketMQ's MessageConst.PROPERTY_SHARDING_KEY
PROP_BORN_HOST = "__BORNHOST"
PROP_DELIVER_MS = "TIMER_DELIVER_MS"  # client.types' timer property, ms since the epoch
# Names a protocol message's user properties may not use: the gateway and the broker give them
# a meaning of their own (RocketMQ's client refuses most of them as well).
SYSTEM_PROPERTY_NAMES = frozenset({
    PROP_MESSAGE_GROUP, PROP_BORN_HOST, PROP_DELIVER_MS, "DELAY", "TIMER_DELAY_MS",
    "TIMER_DELAY_SEC", "TAGS", "KEYS", "UNIQ_KEY", "TRAN_MSG", "PGROUP", "RETRY_TOPIC",
    "REAL_TOPIC", "REAL_QID", "RECONSUME_TIME", "MAX_RECONSUME_TIMES", "ORIGIN_MESSAGE_ID",
    "DLQ_ORIGIN_TOPIC", "DLQ_ORIGIN_MESSAGE_ID", "TRANSACTION_ID", PRIORITY_PROPERTY})
MESSAGE_ID_MAX_CHARS = 128
MESSAGE_GROUP_MAX_CHARS = 64  # RocketMQ proxy's default maxMessageGroupSize
TAG_MAX_CHARS = 255
KEY_MAX_CHARS = 255
PROPERTY_CHARS_MAX = 16 * 1024  # all user property names and values together (RocketMQ's 16 KiB)
# A delivery time past this many seconds since the epoch (the year 5138) is taken to be in
# milliseconds: the Python client 5.1.x writes its millisecond timestamp into the seconds field.
DELIVERY_SECONDS_MAX = 10**11


log = logging.getLogger("broker.grpc")
Call = TypeVar("Call", bound=Callable[..., Awaitable[Any]])


def guarded(response: Callable[..., Any]) -> Callable[[Call], Call]:
    """A unary call whose unexpected failure is logged and answered INTERNAL_SERVER_ERROR in
    ``response`` (rather than gRPC's bare UNKNOWN status)."""
    def wrap(fn: Call) -> Call:
        @functools.wraps(fn)
        async def call(self: Any, request: Any, context: Any) -> Any:
            try:
                return await fn(self, request, context)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # any bug: a named status, logged
                log.exception("gRPC %s failed", fn.__name__)
                return response(status=status(pb.Code.INTERNAL_SERVER_ERROR,
                                              f"{type(err).__name__}: {err}"))
        return call  # type: ignore[return-value]
    return wrap


class GatewayError(Exception):
    """A request the gateway answers with ``code`` (a ``pb.Code``) and this text."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code


def status(code: int = pb.Code.OK, message: str = "OK") -> pb.Status:
    return pb.Status(code=code, message=message)


class Inbound:
    """One protocol message checked and turned into our send row."""

    __slots__ = ("topic", "row", "kind", "message_group", "message_id")

    def __init__(self, topic: str, row: list[Any], kind: int, message_group: str,
                 message_id: str) -> None:
        self.topic = topic
        self.row = row
        self.kind = kind  # a pb.MessageType
        self.message_group = message_group
        self.message_id = message_id


def _ms(ts: Any) -> int:
    seconds = int(ts.seconds)
    if seconds > DELIVERY_SECONDS_MAX:
        return seconds
    return seconds * 1000 + int(ts.nanos) // 1_000_000


def inbound(m: Any, max_body_bytes: int, now_ms: int, max_delay_ms: int) -> Inbound:
    """Check ``m`` (a ``pb.Message`` from a SendMessageRequest) and build our send row, or raise
    ``GatewayError`` naming what is wrong with it."""
    topic = m.topic.name
    if not topic:
        raise GatewayError(pb.Code.ILLEGAL_TOPIC, "the message names no topic")
    body = bytes(m.body)
    if not body:
        raise GatewayError(pb.Code.MESSAGE_BODY_EMPTY, "the message body is empty")
    if len(body) > max_body_bytes:
        raise GatewayError(pb.Code.MESSAGE_BODY_TOO_LARGE,
                           f"the body's {len(body)} bytes exceed the maximum {max_body_bytes}")
    sp = m.system_properties
    if sp.body_encoding == pb.Encoding.GZIP:
        raise GatewayError(pb.Code.NOT_IMPLEMENTED, "gzip-encoded bodies are not supported")
    message_id = sp.message_id
    if not message_id or len(message_id) > MESSAGE_ID_MAX_CHARS:
        raise GatewayError(pb.Code.ILLEGAL_MESSAGE_ID,
                           f"a message id has 1..{MESSAGE_ID_MAX_CHARS} characters")
    tag = sp.tag
    if len(tag) > TAG_MAX_CHARS or "|" in tag or (tag and not tag.strip()):
        raise GatewayError(pb.Code.ILLEGAL_MESSAGE_TAG, f"bad tag {tag[:40]!r}")
    keys = tuple(sp.keys)
    for k in keys:
        if not k or len(k) > KEY_MAX_CHARS or any(c.isspace() for c in k):
            raise GatewayError(pb.Code.ILLEGAL_MESSAGE_KEY, f"bad key {k[:40]!r}")
    props: list[list[str]] = []
    size = 0
    for name, value in sorted(m.user_properties.items()):
        if not name or name in SYSTEM_PROPERTY_NAMES:
            raise GatewayError(pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                               f"property name {name!r} is reserved")
        size += len(name) + len(value)
        props.append([name, value])
    if size > PROPERTY_CHARS_MAX:
        raise GatewayError(pb.Code.MESSAGE_PROPERTIES_TOO_LARGE,
                           f"user properties of {size} characters exceed {PROPERTY_CHARS_MAX}")
    kind = sp.message_type or pb.MessageType.NORMAL
    group = sp.message_group
    has_delivery = sp.HasField("delivery_timestamp")
    if kind == pb.MessageType.FIFO:
        if not group or len(group) > MESSAGE_GROUP_MAX_CHARS:
            raise GatewayError(pb.Code.ILLEGAL_MESSAGE_GROUP,
                               f"a FIFO message's group has 1..{MESSAGE_GROUP_MAX_CHARS} characters")
        props.append([PROP_MESSAGE_GROUP, group])
    elif group:
        raise GatewayError(pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                           "only a FIFO message has a message group")
    if kind == pb.MessageType.DELAY:
        if not has_delivery:
            raise GatewayError(pb.Code.ILLEGAL_DELIVERY_TIME, "a DELAY message needs a delivery time")
        due_ms = _ms(sp.delivery_timestamp)
        if due_ms - now_ms > max_delay_ms:
            raise GatewayError(pb.Code.ILLEGAL_DELIVERY_TIME,
                               f"the delivery time is more than {max_delay_ms} ms ahead")
        if due_ms > now_ms:
            props.append([PROP_DELIVER_MS, str(due_ms)])
    elif has_delivery:
        raise GatewayError(pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                           "only a DELAY message has a delivery time")
    if kind == pb.MessageType.PRIORITY:  # (protocol.priority: the property our broker orders by)
        if not sp.HasField("priority") or not 0 <= sp.priority <= PRIORITY_MAX:
            raise GatewayError(pb.Code.BAD_REQUEST, f"a PRIORITY message's priority is "
                               f"0..{PRIORITY_MAX}, not {sp.priority}")
        props.append([PRIORITY_PROPERTY, str(sp.priority)])
    elif sp.HasField("priority"):
        raise GatewayError(pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                           "only a PRIORITY message has a priority")
    if kind not in (pb.MessageType.NORMAL, pb.MessageType.FIFO, pb.MessageType.DELAY,
                    pb.MessageType.TRANSACTION, pb.MessageType.PRIORITY):
        raise GatewayError(pb.Code.NOT_IMPLEMENTED,
                           f"message type {pb.MessageType.Name(kind)} is not supported")
    if sp.born_host:
        props.append([PROP_BORN_HOST, sp.born_host[:255]])
    born_ms = _ms(sp.born_timestamp) if sp.HasField("born_timestamp") else now_ms
    row = [body, tag, list(keys), message_id, props, born_ms]
    if bp.message_bytes(topic, body, tag, keys, message_id, tuple((n, v) for n, v in props)) \
            > max_body_bytes + PROPERTY_CHARS_MAX + 4096:
        raise GatewayError(pb.Code.PAYLOAD_TOO_LARGE, "the message is too large")
    return Inbound(topic, row, kind, group, message_id)


def outbound(topic: str, queue_id: int, queue_offset: int, body: bytes, tags: str,
             keys: tuple[str, ...], unique_key: str, properties: tuple[tuple[str, str], ...],
             born_ts_ms: int, store_ts_ms: int, delivery_attempt: int = 0,
             receipt_handle: str = "", invisible_ms: int = 0, store_host: str = "") -> Any:
    """A stored message as the protocol's ``Message``: our properties back into system
    properties where the protocol has a field for them, the rest user properties."""
    m = pb.Message(body=body)
    m.topic.name = topic
    sp = m.system_properties
    sp.tag = tags
    sp.keys.extend(keys)
    sp.message_id = bp.message_id(unique_key, properties)
    sp.body_encoding = pb.Encoding.IDENTITY
    sp.born_timestamp.FromMilliseconds(born_ts_ms)
    sp.store_timestamp.FromMilliseconds(store_ts_ms)
    sp.queue_id = queue_id
    sp.queue_offset = queue_offset
    if store_host:
        sp.store_host = store_host
    kind = pb.MessageType.NORMAL
    for name, value in properties:
        if name == PROP_MESSAGE_GROUP:
            sp.message_group = value
            kind = pb.MessageType.FIFO
        elif name == PROP_BORN_HOST:
            sp.born_host = value
        elif name == PRIORITY_PROPERTY and kind == pb.MessageType.NORMAL:
            sp.priority, kind = priority_of([(name, value)]), pb.MessageType.PRIORITY
        elif name == PROP_DELIVER_MS and (deliver_ms := natural(value, 18)) is not None:
            sp.delivery_timestamp.FromMilliseconds(deliver_ms)
            kind = pb.MessageType.DELAY
        elif name not in SYSTEM_PROPERTY_NAMES:
            m.user_properties[name] = value
    sp.message_type = kind
    sp.body_digest.type = pb.DigestType.MD5
    sp.body_digest.checksum = _body_md5(body)
    if delivery_attempt:
        sp.delivery_attempt = delivery_attempt
    if receipt_handle:
        sp.receipt_handle = receipt_handle
        sp.invisible_duration.FromMilliseconds(invisible_ms)
    return m


def _body_md5(body: bytes) -> str:
    """A body's digest as RocketMQ's proxy sends it: MD5, in upper-case hex (the proxy's
    ``BinaryUtil.generateMd5``). Every official client checks it the same way; a CRC32 they
    would not (the Node.js client compares CRC32 as a decimal number)."""
    return hashlib.md5(body, usedforsecurity=False).hexdigest().upper()


# A broker's named refusals by their wire code (``BrokerError.code`` raised by the broker API
# in process, ``RemoteError.code`` from a leader a request was forwarded to, a refused run's
# status), and the log's errors by their wire code, as the protocol's codes.
_BROKER_CODES: dict[str, int] = {
    "TOPIC_NOT_FOUND": pb.Code.TOPIC_NOT_FOUND,
    "NO_PERMISSION": pb.Code.FORBIDDEN,
    "ACCESS_DENIED": pb.Code.FORBIDDEN,
    "SIGNATURE_REFUSED": pb.Code.UNAUTHORIZED,
    "MESSAGE_TOO_LARGE": pb.Code.MESSAGE_BODY_TOO_LARGE,
    "INVALID_TOPIC": pb.Code.ILLEGAL_TOPIC,
    "BAD_DELAY": pb.Code.ILLEGAL_DELIVERY_TIME,
    "BAD_REQUEST": pb.Code.BAD_REQUEST,
    "QUEUE_NOT_FOUND": pb.Code.BAD_REQUEST,
    "INVALID_RECEIPT_HANDLE": pb.Code.INVALID_RECEIPT_HANDLE,
    "MESSAGE_NOT_FOUND": pb.Code.MESSAGE_NOT_FOUND,
    "NOT_RECALLABLE": pb.Code.NOT_FOUND,  # a recall of a message no longer pending
    "BAD_TRANSACTION": pb.Code.INVALID_TRANSACTION_ID,  # and every TXN_* status
    "OFFSET_CONFLICT": pb.Code.INVALID_TRANSACTION_ID,
    "NOT_LEADER": pb.Code.HA_NOT_AVAILABLE,
    "TRANSFERRING": pb.Code.HA_NOT_AVAILABLE,
    "STOPPED": pb.Code.HA_NOT_AVAILABLE,
    "DISK_FULL": pb.Code.HA_NOT_AVAILABLE,
    "OVERLOADED": pb.Code.TOO_MANY_REQUESTS,
    "LEADERSHIP_LOST": pb.Code.PROXY_TIMEOUT,
    "TIMEOUT": pb.Code.PROXY_TIMEOUT,
    "OUTCOME_UNKNOWN": pb.Code.PROXY_TIMEOUT,
}

# Our client library's errors (client.errors) and the log's (protocol.errors), by class.
_CODES: tuple[tuple[type[Exception], int], ...] = (
    (errors.TopicNotFoundError, pb.Code.TOPIC_NOT_FOUND),
    (errors.MessageTooLargeError, pb.Code.MESSAGE_BODY_TOO_LARGE),
    (errors.NoPermissionError, pb.Code.FORBIDDEN),
    (errors.InvalidTopicError, pb.Code.ILLEGAL_TOPIC),
    (errors.BadDelayError, pb.Code.ILLEGAL_DELIVERY_TIME),
    (errors.TransactionError, pb.Code.INVALID_TRANSACTION_ID),
    (errors.BadTransactionError, pb.Code.INVALID_TRANSACTION_ID),
    (errors.MessageNotFoundError, pb.Code.MESSAGE_NOT_FOUND),
    (errors.AccessDeniedError, pb.Code.FORBIDDEN),  # (another group's refusal, with --acl)
    (errors.SignatureError, pb.Code.UNAUTHORIZED),
    (errors.OverloadedError, pb.Code.TOO_MANY_REQUESTS),
    (errors.SendTimeoutError, pb.Code.PROXY_TIMEOUT),
    (errors.RetriableError, pb.Code.HA_NOT_AVAILABLE),  # unavailable, no leader yet
    (errors.NonRetriableError, pb.Code.BAD_REQUEST),
    (OverloadedError, pb.Code.TOO_MANY_REQUESTS),
    (OutcomeUnknownError, pb.Code.PROXY_TIMEOUT),  # timeouts, leadership lost, connection lost
    (ProposalError, pb.Code.HA_NOT_AVAILABLE),  # not leader, transferring, stopped: not acted on
    (DiskFullError, pb.Code.HA_NOT_AVAILABLE),
    (UnavailableError, pb.Code.HA_NOT_AVAILABLE),  # no node of the group answered as leader
    (BadRequestError, pb.Code.BAD_REQUEST),
    (WireError, pb.Code.BAD_REQUEST),
    (AccessDeniedError, pb.Code.FORBIDDEN),  # the broker API's, in process (--acl)
    (SignatureError, pb.Code.UNAUTHORIZED),
)


def code_of(err: Exception) -> int:
    """The protocol code for an error of the broker API (a broker's named refusal, in process or
    from the leader a request was forwarded to; the log's errors), of our client library (other
    groups' requests), or the gateway's own (INTERNAL_SERVER_ERROR for one none of them names)."""
    if isinstance(err, GatewayError):
        return err.code
    if isinstance(err, (BrokerError, RemoteError)):
        return status_code(str(err.code))
    for cls, code in _CODES:
        if isinstance(err, cls):
            return code
    return int(pb.Code.INTERNAL_SERVER_ERROR)


def status_code(name: str) -> int:
    """The protocol code for a broker's named status (a refusal's code)."""
    if name.startswith("TXN_"):
        return int(pb.Code.INVALID_TRANSACTION_ID)
    return int(_BROKER_CODES.get(name, pb.Code.INTERNAL_SERVER_ERROR))
