"""RocketMQ 5 request signatures as the gRPC endpoint checks them (``broker.frontends.grpc.
signature``): the metadata the official Python client makes from its ``Credentials`` is accepted
as its account's, and every way a call can fail to be one account's is a ``SignatureError``
saying why."""

from __future__ import annotations

import time

import pytest
from rocketmq import ClientConfiguration, Credentials
from rocketmq.v5.util.signature import Signature

from broker.frontends.grpc.signature import (
    DATE_TIME,
    date_time_ms,
    headers,
    parse_authorization,
    signature_of,
    signed_by,
    skew_ms,
)
from protocol.auth import SignatureError

SECRETS = {"alice": "alice-secret-1", "bob": "bob-secret-22"}
WINDOW_MS = 60_000
STAMP = "20260102T030405Z"
STAMP_MS = 1767323045000  # 2026-01-02 03:04:05 UTC


def official(ak: str = "", sk: str = "") -> list[tuple[str, str]]:
    """The metadata the official client sends with every call."""
    config = ClientConfiguration("127.0.0.1:8081", Credentials(ak, sk))
    return list(Signature.metadata(config, "client-1"))


def check(metadata: list[tuple[str, str]], now_ms: int | None = None,
          offset_s: int | None = None) -> str:
    now_s = time.time()
    return signed_by(metadata, SECRETS.get,
                     int(now_s * 1000) if now_ms is None else now_ms, WINDOW_MS,
                     time.localtime(now_s).tm_gmtoff if offset_s is None else offset_s)


def signed(date_time: str, ak: str = "alice", secret: str = "alice-secret-1",
           algorithm: str = "MQv2-HMAC-SHA1", signed_headers: str = "x-mq-date-time"
           ) -> list[tuple[str, str]]:
    return [(DATE_TIME, date_time), ("x-mq-client-id", "c"),
            ("authorization", f"{algorithm} Credential={ak}, SignedHeaders={signed_headers}, "
                              f"Signature={signature_of(secret, date_time)}")]


def test_the_official_clients_metadata_is_its_accounts() -> None:
    assert check(official("alice", "alice-secret-1")) == "alice"
    assert check(official("bob", "bob-secret-22")) == "bob"
    # (the client's own HMAC and ours agree)
    assert Signature.sign("alice-secret-1", STAMP) == signature_of("alice-secret-1", STAMP)


def test_a_wrong_secret_or_an_unknown_key_is_refused_alike() -> None:
    for md in (official("alice", "not-the-secret"), official("carol", "alice-secret-1")):
        with pytest.raises(SignatureError, match="unknown access key or wrong secret"):
            check(md)
    md = official("alice", "alice-secret-1")  # a signature changed by one digit
    auth = dict(md)["authorization"]
    forged = auth[:-1] + ("0" if auth[-1] != "0" else "1")
    with pytest.raises(SignatureError, match="does not match"):
        check([(k, forged if k == "authorization" else v) for k, v in md])


def test_no_credentials_are_refused_by_name() -> None:
    with pytest.raises(SignatureError, match="names no access key"):
        check(official())  # the client's empty Credentials(): Credential= with nothing
    with pytest.raises(SignatureError, match="names no access key"):
        check([(DATE_TIME, STAMP)])  # no authorization at all


def test_a_date_time_outside_the_window_is_refused_and_inside_accepted() -> None:
    md = signed(STAMP)
    assert check(md, now_ms=STAMP_MS + WINDOW_MS, offset_s=0) == "alice"
    assert check(md, now_ms=STAMP_MS - WINDOW_MS, offset_s=0) == "alice"
    with pytest.raises(SignatureError, match=r"61 s from this node's clock .*window is 60 s"):
        check(md, now_ms=STAMP_MS + WINDOW_MS + 1000, offset_s=0)
    with pytest.raises(SignatureError, match="stale or replayed"):
        check(md, now_ms=STAMP_MS - 3_600_000, offset_s=0)


def test_a_client_writing_the_nodes_local_time_is_accepted() -> None:
    """The official clients write their local time with a Z: a node 2 h east of UTC accepts a
    client beside it (its stamp 2 h ahead of UTC), and a client writing UTC."""
    east_s = 2 * 3600
    assert check(signed(STAMP), now_ms=STAMP_MS - east_s * 1000, offset_s=east_s) == "alice"
    assert check(signed(STAMP), now_ms=STAMP_MS, offset_s=east_s) == "alice"
    with pytest.raises(SignatureError, match="time zone"):  # a third zone: an hour off both
        check(signed(STAMP), now_ms=STAMP_MS - 3600 * 1000, offset_s=east_s)
    assert skew_ms(STAMP_MS, STAMP_MS - east_s * 1000, east_s) == 0


@pytest.mark.parametrize("bad", ["2026-01-02T03:04:05Z", "20260102T030405", "20261302T030405Z",
                                 "20260102T250405Z", "2026012T0304051Z", "", "x" * 16])
def test_a_malformed_date_time_is_refused(bad: str) -> None:
    with pytest.raises(SignatureError, match="YYYYMMDDTHHMMSSZ"):
        date_time_ms(bad)
    with pytest.raises(SignatureError, match="YYYYMMDDTHHMMSSZ"):
        check(signed(bad))


def test_the_date_time_is_read_as_utc() -> None:
    assert date_time_ms(STAMP) == STAMP_MS


@pytest.mark.parametrize(("text", "why"), [
    ("HMAC-SHA256 Credential=alice, SignedHeaders=x-mq-date-time, Signature=" + "0" * 40,
     "algorithm is MQv2-HMAC-SHA1"),
    ("MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time", "lacks Signature"),
    ("MQv2-HMAC-SHA1 Credential=alice, Credential=bob, SignedHeaders=x-mq-date-time, "
     "Signature=" + "0" * 40, "malformed authorization field"),
    ("MQv2-HMAC-SHA1 Credential=alice SignedHeaders=x-mq-date-time", "lacks Signature"),
    ("MQv2-HMAC-SHA1 Credential=a b, SignedHeaders=x-mq-date-time, Signature=" + "0" * 40,
     "malformed access key"),
    ("MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, Signature=xyz",
     "40 hexadecimal digits"),
    ("MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, Signature=" + "g" * 40,
     "40 hexadecimal digits"),
    ("MQv2-HMAC-SHA1 " + "x" * 600, "over 512 characters"),
])
def test_a_malformed_authorization_is_refused_by_name(text: str, why: str) -> None:
    with pytest.raises(SignatureError, match=why):
        parse_authorization(text)


def test_the_credential_may_carry_a_scope_after_the_key() -> None:
    auth = parse_authorization("MQv2-HMAC-SHA1 Credential=alice/region/service, "
                               "SignedHeaders=x-mq-date-time, Signature=" + "AB" * 20)
    assert (auth.access_key, auth.signed_headers, auth.signature) == \
        ("alice", ("x-mq-date-time",), "ab" * 20)


def test_headers_given_twice_other_signed_headers_or_no_date_time_are_refused() -> None:
    md = signed(STAMP)
    with pytest.raises(SignatureError, match="more than once"):
        headers([*md, ("authorization", dict(md)["authorization"])])
    with pytest.raises(SignatureError, match="not text"):
        headers([(DATE_TIME, b"20260102T030405Z")])
    with pytest.raises(SignatureError, match="signed headers are x-mq-date-time"):
        check(signed(STAMP, signed_headers="x-mq-date-time;host"))
    with pytest.raises(SignatureError, match="no x-mq-date-time header"):
        check([(k, v) for k, v in md if k != DATE_TIME])
    # a signature made for another date-time does not match this one
    other = [(DATE_TIME, "20260102T030406Z") if k == DATE_TIME else (k, v) for k, v in md]
    with pytest.raises(SignatureError, match="does not match"):
        check(other, now_ms=STAMP_MS, offset_s=0)
