"""The dledger client library: a producer, a pull consumer, a lite pull consumer (polls from
buffers its background pullers fill, its queues shared in the group or assigned) and a push
consumer (clustering with rebalancing, or broadcasting with progress in a local file), a
transactional producer (half messages, check-back), async-first with blocking twins
(SyncProducer, SyncTransactionProducer, SyncPullConsumer, SyncLitePullConsumer,
SyncPushConsumer), message query by offset msg id, unique key or key (MessageQuery,
SyncMessageQuery), message trace (``trace=True``), routes from the NameServers, one exception
hierarchy."""

from client.cluster.query import FoundMessage, MessageQuery, SyncMessageQuery
from client.consumer.lite import LitePullConsumer
from client.consumer.pull import PullConsumer
from client.consumer.push import PushConsumer
from client.errors import (
    AccessDeniedError,
    BadDelayError,
    BadFilterError,
    BadTransactionError,
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
    SignatureError,
    StaleRouteError,
    TlsError,
    TopicNotFoundError,
    TransactionError,
    UnavailableError,
)
from client.producer.batch import message_bytes, split_batch
from client.producer.pipeline import Pipeline
from client.producer.producer import Producer
from client.producer.transaction import (
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
    TransactionState,
)
from client.producer.txn_batch import Transaction
from client.sync import (
    SyncLitePullConsumer,
    SyncProducer,
    SyncPullConsumer,
    SyncPushConsumer,
    SyncTransactionProducer,
)
from client.types import ConsumeStatus, Message, MessageQueue, PullResult, ReceivedMessage, SendResult
from protocol.auth import Credentials

__all__ = [
    "AccessDeniedError",
    "BadDelayError",
    "BadFilterError",
    "BadTransactionError",
    "ClientClosedError",
    "ClientError",
    "ClientNotStartedError",
    "ConsumeStatus",
    "ConsumerGroupActiveError",
    "Credentials",
    "FoundMessage",
    "InvalidTopicError",
    "LitePullConsumer",
    "Message",
    "MessageNotFoundError",
    "MessageQuery",
    "MessageQueue",
    "MessageTooLargeError",
    "NoLeaderYetError",
    "NoPermissionError",
    "NonRetriableError",
    "NotLeaderError",
    "OffsetStoreError",
    "OffsetStoreLockedError",
    "OverloadedError",
    "Pipeline",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PushConsumer",
    "ReceivedMessage",
    "RetriableError",
    "SendResult",
    "SendTimeoutError",
    "SignatureError",
    "StaleRouteError",
    "SyncLitePullConsumer",
    "SyncMessageQuery",
    "SyncProducer",
    "SyncPullConsumer",
    "SyncPushConsumer",
    "SyncTransactionProducer",
    "TlsError",
    "TopicNotFoundError",
    "Transaction",
    "TransactionError",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "TransactionState",
    "UnavailableError",
    "message_bytes",
    "split_batch",
]
