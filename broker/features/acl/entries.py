"""The log entries that change the ACL (``broker.features.acl.model``): their shapes, encoding and strict
decoding. Kinds 16-17 of the broker's entry envelope (``broker.core.entries``, whose decoder table
includes these once this module is imported).

- ACL_PUT ``[ts, account row]``: add or replace an account (``Account.row``: key, secret, admin,
  default topic and group permissions, topic and group permissions)
- ACL_DELETE ``[ts, access key]``

The secret travels in the entry: every replica must check signatures (RocketMQ keeps its plain
ACL file on each broker the same way). Views and logs never show it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import cbor2

import broker.core.entries as be
from broker.features.acl.model import Account
from protocol.auth_rules import check_access_key

KIND_ACL_PUT = 16
KIND_ACL_DELETE = 17


@dataclass(frozen=True, slots=True)
class AclPut:
    store_ts_ms: int
    account: Account


@dataclass(frozen=True, slots=True)
class AclDelete:
    store_ts_ms: int
    access_key: str


AclEntries = AclPut | AclDelete


def encode_acl(e: AclEntries) -> bytes:
    if isinstance(e, AclPut):
        return cbor2.dumps([be.VERSION, KIND_ACL_PUT, e.store_ts_ms, e.account.row()])
    return cbor2.dumps([be.VERSION, KIND_ACL_DELETE, e.store_ts_ms, e.access_key])


def _put(f: list[Any]) -> AclPut:
    ts, row = f
    return AclPut(be._int(ts), Account.from_row(row))


def _delete(f: list[Any]) -> AclDelete:
    ts, key = f
    return AclDelete(be._int(ts), check_access_key(key))


DECODERS: dict[int, Callable[[list[Any]], Any]] = {KIND_ACL_PUT: _put, KIND_ACL_DELETE: _delete}
be._DECODERS.update(DECODERS)  # decode() and decode_for_apply() know the ACL kinds from here on
