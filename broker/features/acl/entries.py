"""The log entries that change the ACL (``broker.features.acl.model``): their shapes, encoding and strict
decoding. Kinds 16-17 of the broker's entry envelope (``broker.core.codec``; registered by
``broker.features.acl.apply``).

- ACL_PUT ``[ts, account row]``: add or replace an account (``Account.row``: key, secret, admin,
  default topic and group permissions, topic and group permissions)
- ACL_DELETE ``[ts, access key]``

The secret travels in the entry: every replica must check signatures (RocketMQ keeps its plain
ACL file on each broker the same way). Views and logs never show it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.core.codec import as_int, dump
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


def encode_acl_put(e: AclPut) -> bytes:
    return dump(KIND_ACL_PUT, [e.store_ts_ms, e.account.row()])


def encode_acl_delete(e: AclDelete) -> bytes:
    return dump(KIND_ACL_DELETE, [e.store_ts_ms, e.access_key])


def decode_acl_put(number: int, f: list[Any]) -> AclPut:
    ts, row = f
    return AclPut(as_int(ts), Account.from_row(row))


def decode_acl_delete(number: int, f: list[Any]) -> AclDelete:
    ts, key = f
    return AclDelete(as_int(ts), check_access_key(key))


__all__ = ["KIND_ACL_DELETE", "KIND_ACL_PUT", "AclDelete", "AclEntries", "AclPut",
           "decode_acl_delete", "decode_acl_put", "encode_acl_delete", "encode_acl_put"]
