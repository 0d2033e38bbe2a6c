"""The dledger client library: a producer, a pull consumer and a push consumer (clustering with
rebalancing, or broadcasting), async-first with blocking twins of the producer and the pull
consumer, routes from the NameServers, one exception hierarchy."""

from client.batch import message_bytes, split_batch
from client.consumer import PullConsumer
from client.errors import (
    ClientError,
    InvalidTopicError,
    MessageTooLargeError,
    NoLeaderYetError,
    NonRetriableError,
    NoPermissionError,
    NotLeaderError,
    OverloadedError,
    RetriableError,
    SendTimeoutError,
    StaleRouteError,
    TopicNotFoundError,
    UnavailableError,
)
from client.producer import Producer
from client.push import ConsumeStatus, PushConsumer
from client.sync import SyncProducer, SyncPullConsumer
from client.types import Message, MessageQueue, PullResult, ReceivedMessage, SendResult

__all__ = [
    "ClientError", "ConsumeStatus", "InvalidTopicError", "Message", "MessageQueue", "MessageTooLargeError",
    "NoLeaderYetError", "NoPermissionError", "NonRetriableError", "NotLeaderError",
    "OverloadedError", "Producer", "PullConsumer", "PushConsumer", "PullResult", "ReceivedMessage",
    "RetriableError", "SendResult", "SendTimeoutError", "StaleRouteError", "SyncProducer", "SyncPullConsumer",
    "TopicNotFoundError", "UnavailableError", "message_bytes", "split_batch",
]
