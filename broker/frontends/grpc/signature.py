"""RocketMQ 5 clients' request signatures (a client's ``Credentials(access_key, secret_key)``),
checked at the gRPC endpoint when access control is on: the pure half of
``broker.frontends.grpc.access``.

Every call of a RocketMQ 5 client carries, in its gRPC metadata, ``x-mq-date-time`` (the
client's clock to the second, written ``YYYYMMDDTHHMMSSZ``) and ``authorization``::

    MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time, Signature=<hex>

the signature being the hexadecimal HMAC-SHA1, under the account's secret, of the date-time's
text: it proves that the caller knew the secret at that second, and covers nothing of the call
itself. So the date-time must lie within the node's replay window (``--acl-replay-window-s``) of
the node's clock; within it, the same headers can be sent with any call (there is no sequence
to count): give the gRPC listener TLS where the network is not trusted.

The official clients write their *local* time with the ``Z`` suffix (Java's SimpleDateFormat
and Python's ``datetime.now()`` use the host's time zone), so a date-time is accepted when it
is within the window of the node's clock read as UTC or as the node's own local time; a client
in a third time zone is refused, its message naming the difference.

Owns: reading the two headers (``headers``), the authorization's fields
(``parse_authorization``), the date-time (``date_time_ms``), the signature (``signature_of``)
and the whole check (``signed_by``). Every refusal is ``protocol.auth.SignatureError``, its
message saying why (one answer for an unknown access key and a wrong secret, as our protocol
gives). Pure: no clock (the time and the node's UTC offset are passed in).
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from protocol.auth import SignatureError
from protocol.auth_rules import check_access_key

__all__ = [
    "ALGORITHM", "AUTHORIZATION", "DATE_TIME", "Authorization", "date_time_ms", "headers",
    "parse_authorization", "signature_of", "signed_by", "skew_ms",
]

ALGORITHM = "MQv2-HMAC-SHA1"
AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
DATE_TIME_SHAPE = re.compile(r"[0-9]{8}T[0-9]{6}Z")
AUTHORIZATION_CHARS_MAX = 512
SIGNATURE_HEX_CHARS = 40  # SHA-1's 20 bytes
NO_ACCOUNT = ("access control is on: the call names no access key (give the client "
              "Credentials(access_key, secret_key) of an account)")


@dataclass(frozen=True, slots=True)
class Authorization:
    access_key: str
    signed_headers: tuple[str, ...]
    signature: str  # lower-case hex


def headers(metadata: Iterable[tuple[str, Any]]) -> dict[str, str]:
    """The two headers the check reads, from a call's metadata pairs (gRPC gives their names in
    lower case); SignatureError if either is given twice or is not text."""
    out: dict[str, str] = {}
    for name, value in metadata:
        if name not in (AUTHORIZATION, DATE_TIME):
            continue
        if name in out:
            raise SignatureError(f"the call gives {name} more than once")
        if not isinstance(value, str):
            raise SignatureError(f"{name} is not text")
        out[name] = value
    return out


def parse_authorization(text: str) -> Authorization:
    """``MQv2-HMAC-SHA1 Credential=AK, SignedHeaders=x-mq-date-time, Signature=HEX``, each field
    checked; a ``Credential`` of ``AK/...`` names the access key before the first ``/``."""
    if len(text) > AUTHORIZATION_CHARS_MAX:
        raise SignatureError(f"the authorization header is over {AUTHORIZATION_CHARS_MAX} "
                             "characters")
    algorithm, _, rest = text.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise SignatureError(f"the authorization's algorithm is {ALGORITHM}, not "
                             f"{algorithm[:32]!r}")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, eq, value = part.strip().partition("=")
        if not eq or name in fields:
            raise SignatureError(f"malformed authorization field {part.strip()[:40]!r}")
        fields[name] = value.strip()
    missing = {"Credential", "SignedHeaders", "Signature"} - set(fields)
    if missing:
        raise SignatureError(f"the authorization lacks {', '.join(sorted(missing))}")
    access_key = fields["Credential"].split("/", 1)[0]
    if not access_key:
        raise SignatureError(NO_ACCOUNT)
    try:
        check_access_key(access_key)
    except ValueError as err:
        raise SignatureError(f"malformed access key: {err}") from None
    signature = fields["Signature"].lower()
    if len(signature) != SIGNATURE_HEX_CHARS \
            or any(c not in "0123456789abcdef" for c in signature):
        raise SignatureError(f"the signature is {SIGNATURE_HEX_CHARS} hexadecimal digits")
    signed = tuple(h.strip().lower() for h in fields["SignedHeaders"].split(";"))
    return Authorization(access_key, signed, signature)


def date_time_ms(text: str) -> int:
    """``YYYYMMDDTHHMMSSZ`` as milliseconds since the epoch, read as UTC."""
    try:  # (the fields by position: strptime costs most of a call's check)
        if not DATE_TIME_SHAPE.fullmatch(text):
            raise ValueError(text)
        parsed = datetime(int(text[0:4]), int(text[4:6]), int(text[6:8]), int(text[9:11]),
                          int(text[11:13]), int(text[13:15]))
    except ValueError:
        raise SignatureError(f"{DATE_TIME} is YYYYMMDDTHHMMSSZ, not {text[:32]!r}") from None
    return calendar.timegm(parsed.timetuple()) * 1000


def signature_of(secret_key: str, date_time: str) -> str:
    """What a client with ``secret_key`` signs ``date_time`` with."""
    mac = hmac.new(secret_key.encode("utf-8"), date_time.encode("utf-8"), hashlib.sha1)
    return mac.hexdigest()


def skew_ms(stamp_ms: int, now_ms: int, local_offset_s: int) -> int:
    """How far a date-time is from the node's clock: read as UTC, or as the node's local time
    (``local_offset_s`` east of UTC), whichever is nearer."""
    as_utc = abs(now_ms - stamp_ms)
    as_local = abs(now_ms - (stamp_ms - local_offset_s * 1000))
    return min(as_utc, as_local)


def signed_by(metadata: Iterable[tuple[str, Any]], secret_of: Callable[[str], str | None],
              now_ms: int, window_ms: int, local_offset_s: int = 0) -> str:
    """The access key that signed a call with ``metadata`` (``secret_of``: an account's secret,
    None if there is no such account); SignatureError, saying why, if it is not signed by one,
    or its date-time is further than ``window_ms`` from ``now_ms``."""
    found = headers(metadata)
    text = found.get(AUTHORIZATION)
    if text is None:
        raise SignatureError(NO_ACCOUNT)
    auth = parse_authorization(text)
    if auth.signed_headers != (DATE_TIME,):
        raise SignatureError(f"the signed headers are {DATE_TIME}, not "
                             f"{';'.join(auth.signed_headers)[:64]!r}")
    date_time = found.get(DATE_TIME)
    if date_time is None:
        raise SignatureError(f"the call has no {DATE_TIME} header (what its signature signs)")
    stamp_ms = date_time_ms(date_time)
    secret = secret_of(auth.access_key)
    if secret is None or not hmac.compare_digest(signature_of(secret, date_time).encode(),
                                                 auth.signature.encode()):
        raise SignatureError("unknown access key or wrong secret: the signature does not match")
    skew = skew_ms(stamp_ms, now_ms, local_offset_s)
    if skew > window_ms:
        raise SignatureError(f"the call's {DATE_TIME} {date_time} is {skew / 1000:.0f} s from "
                             f"this node's clock (read as UTC or as the node's local time; the "
                             f"window is {window_ms / 1000:.0f} s): a stale or replayed call, "
                             f"or a clock or time zone that differs")
    return auth.access_key
