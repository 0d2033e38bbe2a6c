"""RocketMQ 4.x clients' request signatures (its plain ACL), checked when access control is on:
a signed request carries ``AccessKey`` and ``Signature`` in its header fields, the signature
being the Base64 of HMAC-SHA1, under the account's secret key, of every other header field's
value in the order of their names (``AccessKey`` and the client's own, such as ``OnsChannel``,
included) followed by the body's bytes.

As in RocketMQ, the signature names no time and no nonce: a captured request can be sent again.
Give 4.x clients accounts with what they need and no more, and the remoting listener TLS
(``--tls``) where the network is not trusted.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable

from broker.frontends.remoting.fields import RemotingRefusal
from protocol.remoting import codes
from protocol.remoting.command import Command

__all__ = ["ACCESS_KEY", "SIGNATURE", "signature_of", "signed_by"]

ACCESS_KEY, SIGNATURE = "AccessKey", "Signature"


def signature_of(ext: dict[str, str], body: bytes, secret_key: str) -> str:
    """The signature a 4.x client sends with header fields ``ext`` (``Signature`` left out)
    and ``body``."""
    content = "".join(v for k, v in sorted(ext.items()) if k != SIGNATURE).encode("utf-8")
    mac = hmac.new(secret_key.encode("utf-8"), content + body, hashlib.sha1)
    return base64.b64encode(mac.digest()).decode("ascii")


def signed_by(cmd: Command, secret_of: Callable[[str], str | None]) -> str:
    """The access key that signed ``cmd`` (``secret_of``: an account's secret, None if there
    is no such account); a NO_PERMISSION refusal if it is unsigned or the signature does not
    match (one answer for an unknown key and a wrong secret, as our protocol gives)."""
    key, given = cmd.ext.get(ACCESS_KEY), cmd.ext.get(SIGNATURE)
    if not key or not given:
        raise RemotingRefusal(codes.NO_PERMISSION, "access control is on: sign requests "
                              "(the client's AccessKey and SecretKey: SessionCredentials, "
                              "AclClientRPCHook)")
    secret = secret_of(key)
    if secret is None or not hmac.compare_digest(
            signature_of(cmd.ext, cmd.body, secret).encode(), given.encode("utf-8", "replace")):
        raise RemotingRefusal(codes.NO_PERMISSION, "unknown access key or wrong secret: the "
                              "signature does not match")
    return key
