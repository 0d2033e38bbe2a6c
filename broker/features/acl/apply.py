"""Applying the ACL's entries: an account put or deleted in the feature's ``AclTable`` (kept
under ``acl``). Pure and deterministic; ``KINDS`` registers both entries once."""

from __future__ import annotations

from broker.core.applied import ApplyResult
from broker.core.registry import EntryKind
from broker.core.state import CoreState
from broker.features.acl.entries import (
    KIND_ACL_DELETE,
    KIND_ACL_PUT,
    AclDelete,
    AclPut,
    decode_acl_delete,
    decode_acl_put,
    encode_acl_delete,
    encode_acl_put,
)
from broker.features.acl.model import AclTable

__all__ = ["KINDS", "PART", "apply_acl_delete", "apply_acl_put"]

PART = "acl"  # the AclTable's name in the state and its checkpoints


def apply_acl_put(state: CoreState, index: int, position: int, e: AclPut) -> ApplyResult:
    return ApplyResult(index, state.part(PART, AclTable).put(e.account))


def apply_acl_delete(state: CoreState, index: int, position: int, e: AclDelete) -> ApplyResult:
    return ApplyResult(index, state.part(PART, AclTable).delete(e.access_key))


KINDS = (EntryKind("acl_put", (KIND_ACL_PUT,), (AclPut,), encode_acl_put, decode_acl_put,
                   apply_acl_put),
         EntryKind("acl_delete", (KIND_ACL_DELETE,), (AclDelete,), encode_acl_delete,
                   decode_acl_delete, apply_acl_delete))
