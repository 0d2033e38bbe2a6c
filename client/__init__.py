"""The dledger client library: a producer, a pull consumer and a push consumer (clustering with
rebalancing, or broadcasting with progress in a local file), async-first with blocking twins
(SyncProducer, SyncPullConsumer, SyncPushConsumer), routes from the NameServers, one exception
hierarchy."""

from client.batch import message_bytes, split_batch
from client.consumer import PullConsumer
from client.errors import (
    BadDelayError,
    BadFilterError,
    ClientClosedError,
    ClientError,
    ClientNotStartedError,
    InvalidTopicError,
    MessageTooLargeError,
    NoLeaderYetError,
    NonRetriableError,
    NoPermissionError,
    NotLeaderError,
    OffsetStoreError,
    OffsetStoreLockedError,
    OverloadedError,
    RetriableError,
    SendTimeoutError,
    StaleRouteError,
    TopicNotFoundError,
    UnavailableError,
)
from client.producer import Producer
from client.push import ConsumeStatus, PushConsumer
from client.sync import SyncProducer, SyncPullConsumer, SyncPushConsumer
from client.types import Message, MessageQueue, PullResult, ReceivedMessage, SendResult

__all__ = [
    "BadDelayError", "BadFilterError", "ClientClosedError", "ClientError", "ClientNotStartedError", "ConsumeStatus",
    "InvalidTopicError", "Message", "MessageQueue", "MessageTooLargeError", "NoLeaderYetError",
    "NoPermissionError", "NonRetriableError", "NotLeaderError", "OffsetStoreError",
    "OffsetStoreLockedError", "OverloadedError", "Producer", "PullConsumer", "PullResult",
    "PushConsumer", "ReceivedMessage", "RetriableError", "SendResult", "SendTimeoutError",
    "StaleRouteError", "SyncProducer", "SyncPullConsumer", "SyncPushConsumer",
    "TopicNotFoundError", "UnavailableError", "message_bytes", "split_batch",
]
