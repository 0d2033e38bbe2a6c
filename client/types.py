"""The client library's values: typed, frozen dataclasses."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from protocol.message_ttl import TTL_PROPERTY, parse_ttl_ms
from protocol.priority import PRIORITY_PROPERTY, parse_priority

Properties = Mapping[str, str] | Iterable[tuple[str, str]]


@dataclass(frozen=True, slots=True, init=False)
class Message:
    """One message to send. Checked and normalised here, when it is built, so that a wrong type
    fails in the caller's line rather than at the broker:

    - ``body``: bytes (bytearray and memoryview are copied to bytes); a ``str`` is a TypeError:
      encode it (``text.encode()``), the library does not choose an encoding for you;
    - ``tags``: one str (RocketMQ messages have one tag; "" is none);
    - ``keys``: a sequence of str, each one key; or one str, split on whitespace as RocketMQ's
      KEY_SEPARATOR (" ") splits it: ``keys="order-42"`` is the one key ``order-42``,
      ``keys="a b"`` the two keys ``a`` and ``b``;
    - ``properties``: a dict or (name, value) pairs of str, stored as a tuple of pairs in the
      order given; a name given twice is a ValueError.

    Delay (one at most; each becomes the property RocketMQ names, so ``properties`` may carry
    it as well): ``delay_level`` 1..18 (``DELAY``: 1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m
    20m 30m 1h 2h by default, the broker's ``--delay-levels``; a level above the last is the
    last), ``deliver_at_ms`` (``TIMER_DELIVER_MS``, ms since the epoch) or ``delay_ms``
    (``TIMER_DELAY_MS``), at most the broker's ``--max-delay-ms`` ahead (7 days by default). A
    delayed message is invisible to consumers until its time, then appears once in its topic.

    The constructor is written out (not the dataclass's) so that these accepted forms are in
    its signature, while the fields keep their one normalised type. Equal messages hash equal.
    """

    topic: str
    body: bytes
    tags: str
    keys: tuple[str, ...]
    properties: tuple[tuple[str, str], ...]

    def __init__(self, topic: str, body: bytes | bytearray | memoryview, tags: str = "",
                 keys: str | Iterable[str] = (), properties: Properties = (), *,
                 delay_level: int = 0, deliver_at_ms: int | None = None,
                 delay_ms: int | None = None, ttl_ms: int | None = None,
                 priority: int | None = None) -> None:
        if type(topic) is not str:
            raise TypeError(f"Message topic must be a str, not {type(topic).__name__}")
        if type(body) is not bytes:
            body = _body(body)
        if type(tags) is not str:
            raise TypeError(f"Message tags must be one str (a message has one tag), "
                            f"not {type(tags).__name__}")
        put = object.__setattr__  # frozen: the fields are set once, here
        put(self, "topic", topic)
        put(self, "body", body)
        put(self, "tags", tags)
        put(self, "keys", _keys(keys) if keys else ())
        props = _properties(properties) if properties else ()
        if delay_level or deliver_at_ms is not None or delay_ms is not None:
            props = (*props, _delay(delay_level, deliver_at_ms, delay_ms))
        if ttl_ms is not None:
            if type(ttl_ms) is not int:
                raise TypeError(f"Message ttl_ms must be an int, not {type(ttl_ms).__name__}")
            props = (*props, (TTL_PROPERTY, str(parse_ttl_ms(ttl_ms))))
        if priority is not None:
            if type(priority) is not int:
                raise TypeError(f"Message priority must be an int, not {type(priority).__name__}")
            props = (*props, (PRIORITY_PROPERTY, str(parse_priority(priority))))
        if len(props) > 1 and len({n for n, _ in props}) < len(props):
            raise ValueError(f"Message properties name one property twice: {props!r}")
        put(self, "properties", props)

    @property
    def delayed(self) -> bool:
        """Whether a delay property is set (a level above 0, or a time)."""
        return any(n in _TIMER_NAMES and (n != "DELAY" or v not in ("", "0"))
                   for n, v in self.properties) if self.properties else False


_TIMER_NAMES = ("DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_MS", "TIMER_DELAY_SEC")


def _delay(level: int, at_ms: int | None, delay_ms: int | None) -> tuple[str, str]:
    given = [(n, v) for n, v in (("delay_level", level or None), ("deliver_at_ms", at_ms),
                                 ("delay_ms", delay_ms)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"a Message takes one of delay_level, deliver_at_ms, delay_ms, not "
                         f"{', '.join(n for n, _ in given)}")
    name, value = given[0]
    if type(value) is not int or value < 0:
        raise TypeError(f"Message {name} must be a non-negative int, not {value!r}")
    prop = {"delay_level": "DELAY", "deliver_at_ms": "TIMER_DELIVER_MS",
            "delay_ms": "TIMER_DELAY_MS"}[name]
    return prop, str(value)


def _body(body: object) -> bytes:
    if isinstance(body, (bytearray, memoryview)):
        return bytes(body)
    if isinstance(body, str):
        raise TypeError("Message body must be bytes, not str: encode it (e.g. text.encode())")
    raise TypeError(f"Message body must be bytes, not {type(body).__name__}")


def _keys(keys: str | Iterable[str]) -> tuple[str, ...]:
    if isinstance(keys, str):
        return tuple(keys.split())  # RocketMQ's KEY_SEPARATOR form
    out = tuple(keys)
    for k in out:
        if type(k) is not str:
            raise TypeError(f"Message keys must be str, not {type(k).__name__} ({k!r})")
    return out


def _properties(props: Properties) -> tuple[tuple[str, str], ...]:
    items = props.items() if isinstance(props, Mapping) else props
    out: list[tuple[str, str]] = []
    for pair in items:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"Message properties are (name, value) pairs or a dict, not {pair!r}")
        name, value = pair
        if type(name) is not str or type(value) is not str:
            raise TypeError(f"Message property names and values must be str: {name!r}: {value!r} "
                            f"(convert numbers with str())")
        out.append((name, value))
    if len(out) > 1 and len({n for n, _ in out}) < len(out):
        raise ValueError(f"Message properties name one property twice: {out!r}")
    return tuple(out)


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    topic: str
    group: str
    queue_id: int


@dataclass(frozen=True, slots=True)
class SendResult:
    status: str  # SEND_OK
    msg_id: str  # the message's unique key (RocketMQ's UNIQ_KEY)
    offset_msg_id: str  # group + commitlog position + slot: resolvable on any replica
    queue: MessageQueue
    queue_offset: int
    duplicate: bool = False  # a retry: the broker returned the original result
    node: str = ""  # the node (its group's leader) that answered


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """A consumed message. ``queue`` is where it was read (a retry's is ``%RETRY%<group>``);
    ``topic`` is the topic it was sent to (a retry's ``RETRY_TOPIC``), ``msg_id`` the id its
    producer got (the same for every retry of it), ``reconsume_times`` how many times it was
    consumed and failed before (``RECONSUME_TIME``)."""

    queue: MessageQueue
    queue_offset: int
    body: bytes
    tags: str
    keys: tuple[str, ...]
    msg_id: str
    offset_msg_id: str
    properties: tuple[tuple[str, str], ...]
    born_ts_ms: int
    store_ts_ms: int
    topic: str = ""
    reconsume_times: int = 0


@dataclass(frozen=True, slots=True)
class PullResult:
    status: str  # FOUND, NO_NEW_MSG, OFFSET_OUT_OF_RANGE
    next_offset: int
    min_offset: int
    max_offset: int
    messages: tuple[ReceivedMessage, ...] = field(default_factory=tuple)


class ConsumeStatus(enum.Enum):
    """What a push consumer's listener answers for a batch."""

    SUCCESS = "success"
    LATER = "later"
    SUSPEND = "suspend"  # orderly (RocketMQ's SUSPEND_CURRENT_QUEUE_A_MOMENT): again in place


# A push consumer's listener: a batch of messages in, its status out (or None: SUCCESS), or an
# awaitable of it.
Listener = Callable[[list["ReceivedMessage"]],
                    ConsumeStatus | Awaitable[ConsumeStatus | None] | None]
