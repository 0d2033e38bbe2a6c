"""The rules of access keys and secrets, shared by the signer (``protocol.auth``) and the broker's
replicated ACL (``broker.features.acl.model``, which must stay pure): what a valid one looks like."""

from __future__ import annotations

from typing import Any

__all__ = ["ACCESS_KEY_CHARS", "SECRET_KEY_CHARS", "check_access_key", "check_secret_key"]

ACCESS_KEY_CHARS = (3, 64)
SECRET_KEY_CHARS = (8, 256)


def check_access_key(key: Any) -> str:
    lo, hi = ACCESS_KEY_CHARS
    if not isinstance(key, str) or not lo <= len(key) <= hi or not key.isascii() \
            or not all(c.isalnum() or c in "_-." for c in key):
        raise ValueError(f"an access key is {lo}..{hi} characters of A-Z a-z 0-9 _ - .")
    return key


def check_secret_key(secret: Any) -> str:
    lo, hi = SECRET_KEY_CHARS
    if not isinstance(secret, str) or not lo <= len(secret) <= hi or not secret.isprintable():
        raise ValueError(f"a secret key is {lo}..{hi} printable characters")
    return secret
