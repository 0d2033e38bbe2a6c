"""The client library's values: typed, frozen dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Message:
    topic: str
    body: bytes
    tags: str = ""
    keys: tuple[str, ...] = ()
    properties: tuple[tuple[str, str], ...] = ()


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


@dataclass(frozen=True, slots=True)
class PullResult:
    status: str  # FOUND, NO_NEW_MSG, OFFSET_OUT_OF_RANGE
    next_offset: int
    min_offset: int
    max_offset: int
    messages: tuple[ReceivedMessage, ...] = field(default_factory=tuple)
