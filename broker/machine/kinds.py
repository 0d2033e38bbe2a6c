"""Every log entry kind of the broker, in one place: the core's and each feature's, registered
once (``REGISTRY``), and the topics a feature owns the sends to (``ROUTES``). Adding a kind is one
``EntryKind`` in its feature's ``apply`` module and, for a new feature, one line here. The
functions below are the registry's, for callers that encode, decode or read entries."""

from __future__ import annotations

from typing import Any

import broker.features.acl.apply as acl
import broker.features.admin.apply as admin
import broker.features.delay.apply as delay
import broker.features.orderly.apply as orderly
import broker.features.pop.apply as pop
import broker.features.txn.apply as txn
from broker.core.registry import EntryRegistry, StoredTopics
from broker.core.state import CORE_KINDS, TopicRoute

__all__ = ["REGISTRY", "ROUTES", "decode", "decode_for_apply", "encode", "stored_messages",
           "stored_topics_and_messages"]

REGISTRY = EntryRegistry([*CORE_KINDS, *delay.KINDS, *orderly.KINDS, *txn.KINDS, *admin.KINDS,
                          *pop.KINDS, *acl.KINDS])
ROUTES: dict[str, TopicRoute] = {**delay.ROUTES, **txn.ROUTES}


def encode(entry: object) -> bytes:
    return REGISTRY.encode(entry)


def decode(payload: bytes) -> Any:
    return REGISTRY.decode(payload)


def decode_for_apply(payload: bytes) -> Any:
    return REGISTRY.decode_for_apply(payload)


def stored_topics_and_messages(entry: object) -> StoredTopics | None:
    return REGISTRY.stored_topics(entry)


def stored_messages(payload: bytes) -> list[Any]:
    return REGISTRY.stored_messages(payload)
