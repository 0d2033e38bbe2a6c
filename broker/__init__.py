"""The broker: topics, queues, consume queues, offsets and dedup, as a deterministic state machine
applied to committed entries of the replicated log (``dledger``). This package exports the pure
core (``topics``, ``entries``, ``state``); the leader's services (``server``, the send path,
pulls, ``registrar``, ``admin``) are modules of their own."""

from broker.core.consumequeue import CQUnit
from broker.core.entries import Message, OffsetCommit, SendEntry, TopicDelete, TopicPut, decode, encode
from protocol.broker_errors import BadEntryError, BrokerError, InvalidTopicError
from broker.core.applied import ApplyResult
from broker.core.state import BrokerState, StateConfig
from protocol.topics import PERM_READ, PERM_RW, PERM_WRITE, TopicConfig, validate_topic_name

__all__ = [
    "PERM_READ", "PERM_RW", "PERM_WRITE", "ApplyResult", "BadEntryError", "BrokerError",
    "BrokerState", "CQUnit", "InvalidTopicError", "Message", "OffsetCommit", "SendEntry",
    "StateConfig", "TopicConfig", "TopicDelete", "TopicPut", "decode", "encode",
    "validate_topic_name",
]
