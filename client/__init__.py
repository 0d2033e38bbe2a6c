"""The dledger client library: a producer and a pull consumer (async-first, with blocking twins
of the same names), routes from the NameServers, one exception hierarchy. Push consumers with
rebalancing come next."""

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
    TopicNotFoundError,
    UnavailableError,
)
from client.producer import Producer
from client.sync import SyncProducer, SyncPullConsumer
from client.types import Message, MessageQueue, PullResult, ReceivedMessage, SendResult

__all__ = [
    "ClientError", "InvalidTopicError", "Message", "MessageQueue", "MessageTooLargeError",
    "NoLeaderYetError", "NoPermissionError", "NonRetriableError", "NotLeaderError",
    "OverloadedError", "Producer", "PullConsumer", "PullResult", "ReceivedMessage",
    "RetriableError", "SendResult", "SendTimeoutError", "SyncProducer", "SyncPullConsumer",
    "TopicNotFoundError", "UnavailableError",
]
