"""The dledger client library: a producer, a pull consumer, a lite pull consumer (polls from
buffers its background pullers fill, its queues shared in the group or assigned) and a push
consumer (clustering with rebalancing, or broadcasting with progress in a local file), a
transactional producer (half messages, check-back), async-first with blocking twins
(SyncProducer, SyncTransactionProducer, SyncPullConsumer, SyncLitePullConsumer,
SyncPushConsumer), message query by offset msg id, unique key or key (MessageQuery,
SyncMessageQuery), message trace (``trace=True``), routes from the NameServers, one exception
hierarchy."""

from client.producer.batch import message_bytes, split_batch
from client.consumer.pull import PullConsumer
from client.errors import (
    AccessDeniedError,
    SignatureError,
    BadDelayError,
    BadTransactionError,
    BadFilterError,
    ClientClosedError,
    ClientError,
    ClientNotStartedError,
    ConsumerGroupActiveError,
    InvalidTopicError,
    MessageNotFoundError,
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
    TlsError,
    TopicNotFoundError,
    TransactionError,
    UnavailableError,
)
from client.consumer.lite import LitePullConsumer
from client.producer.pipeline import Pipeline
from client.producer.producer import Producer
from client.types import ConsumeStatus
from client.consumer.push import PushConsumer
from client.cluster.query import FoundMessage, MessageQuery, SyncMessageQuery
from client.sync import (
    SyncLitePullConsumer,
    SyncProducer,
    SyncPullConsumer,
    SyncPushConsumer,
    SyncTransactionProducer,
)
from client.producer.transaction import (
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
    TransactionState,
)
from client.producer.txn_batch import Transaction
from client.types import Message, MessageQueue, PullResult, ReceivedMessage, SendResult

from protocol.auth import Credentials

__all__ = [
    "AccessDeniedError", "Credentials", "SignatureError",
    "BadDelayError", "BadFilterError", "BadTransactionError", "ClientClosedError", "ClientError",
    "ClientNotStartedError", "ConsumeStatus", "ConsumerGroupActiveError",
    "InvalidTopicError", "LitePullConsumer", "Message",
    "MessageQueue", "MessageTooLargeError", "NoLeaderYetError", "NoPermissionError",
    "NonRetriableError", "NotLeaderError", "OffsetStoreError", "OffsetStoreLockedError",
    "OverloadedError", "Pipeline", "Producer", "PullConsumer", "PullResult", "PushConsumer", "ReceivedMessage",
    "RetriableError", "SendResult", "SendTimeoutError", "StaleRouteError", "SyncLitePullConsumer",
    "SyncProducer", "SyncPullConsumer", "SyncPushConsumer", "SyncTransactionProducer",
    "TlsError",
    "TopicNotFoundError",
    "Transaction", "TransactionError", "TransactionListener", "TransactionProducer", "TransactionSendResult",
    "TransactionState",
    "UnavailableError", "message_bytes", "split_batch",
    "FoundMessage", "MessageNotFoundError", "MessageQuery", "SyncMessageQuery",
]
