"""The gateway's pure half (``broker.frontends.grpc.codec``): RocketMQ 5 protocol messages checked field by
field and mapped onto our send rows and back."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb

from broker.frontends.grpc.codec import (
    PROP_BORN_HOST,
    PROP_DELIVER_MS,
    PROP_MESSAGE_GROUP,
    GatewayError,
    code_of,
    inbound,
    outbound,
)
from client import errors

NOW_MS = 1_800_000_000_000
MAX_BODY = 1024
MAX_DELAY_MS = 7 * 86_400_000


def message(body: bytes = b"hello", **sp: Any) -> Any:
    m = pb.Message(body=body)
    m.topic.name = "orders"
    m.system_properties.message_id = sp.pop("message_id", "01ABC")
    for name, value in sp.items():
        setattr(m.system_properties, name, value)
    return m


def refused(m: Any) -> int:
    with pytest.raises(GatewayError) as info:
        inbound(m, MAX_BODY, NOW_MS, MAX_DELAY_MS)
    return info.value.code


def test_a_normal_message_becomes_our_send_row() -> None:
    m = message(tag="TagA", born_host="10.0.0.7")
    m.system_properties.keys.extend(["k1", "k2"])
    m.system_properties.born_timestamp.FromMilliseconds(NOW_MS - 5)
    m.user_properties["color"] = "red"
    got = inbound(m, MAX_BODY, NOW_MS, MAX_DELAY_MS)
    assert got.topic == "orders" and got.kind == pb.MessageType.NORMAL
    body, tags, keys, unique_key, props, born_ms = got.row
    assert (body, tags, keys, unique_key, born_ms) == (b"hello", "TagA", ["k1", "k2"], "01ABC",
                                                       NOW_MS - 5)
    assert dict(map(tuple, props)) == {"color": "red", PROP_BORN_HOST: "10.0.0.7"}


def test_fifo_and_delay_messages_carry_their_group_and_time() -> None:
    fifo = inbound(message(message_type=pb.MessageType.FIFO, message_group="g1"), MAX_BODY,
                   NOW_MS, MAX_DELAY_MS)
    assert fifo.message_group == "g1" and [PROP_MESSAGE_GROUP, "g1"] in fifo.row[4]
    d = message(message_type=pb.MessageType.DELAY)
    d.system_properties.delivery_timestamp.FromMilliseconds(NOW_MS + 3000)
    assert [PROP_DELIVER_MS, str(NOW_MS + 3000)] in inbound(d, MAX_BODY, NOW_MS, MAX_DELAY_MS).row[4]
    # The Python client 5.1.x writes milliseconds into the seconds field: read as milliseconds.
    d.system_properties.delivery_timestamp.seconds = NOW_MS + 4000
    d.system_properties.delivery_timestamp.nanos = 0
    assert [PROP_DELIVER_MS, str(NOW_MS + 4000)] in inbound(d, MAX_BODY, NOW_MS, MAX_DELAY_MS).row[4]


@pytest.mark.parametrize("build, code", [
    (lambda: message(b""), pb.Code.MESSAGE_BODY_EMPTY),
    (lambda: message(b"x" * (MAX_BODY + 1)), pb.Code.MESSAGE_BODY_TOO_LARGE),
    (lambda: message(message_id=""), pb.Code.ILLEGAL_MESSAGE_ID),
    (lambda: message(tag="a|b"), pb.Code.ILLEGAL_MESSAGE_TAG),
    (lambda: message(message_type=pb.MessageType.FIFO), pb.Code.ILLEGAL_MESSAGE_GROUP),
    (lambda: message(message_group="g"), pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (lambda: message(message_type=pb.MessageType.DELAY), pb.Code.ILLEGAL_DELIVERY_TIME),
    (lambda: message(message_type=pb.MessageType.LITE), pb.Code.NOT_IMPLEMENTED),
    (lambda: message(body_encoding=pb.Encoding.GZIP), pb.Code.NOT_IMPLEMENTED),
])
def test_a_bad_message_is_refused_with_the_protocols_code(build: Any, code: int) -> None:
    assert refused(build()) == code


def test_reserved_property_names_keys_and_far_delays_are_refused() -> None:
    m = message()
    m.user_properties["UNIQ_KEY"] = "forged"
    assert refused(m) == pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY
    m = message()
    m.system_properties.keys.append("two words")
    assert refused(m) == pb.Code.ILLEGAL_MESSAGE_KEY
    m = message()
    m.user_properties["big"] = "v" * 20_000
    assert refused(m) == pb.Code.MESSAGE_PROPERTIES_TOO_LARGE
    d = message(message_type=pb.MessageType.DELAY)
    d.system_properties.delivery_timestamp.FromMilliseconds(NOW_MS + MAX_DELAY_MS + 1000)
    assert refused(d) == pb.Code.ILLEGAL_DELIVERY_TIME


def test_a_stored_message_maps_back_with_its_system_properties() -> None:
    props = (("color", "red"), (PROP_MESSAGE_GROUP, "g1"), (PROP_BORN_HOST, "10.0.0.7"))
    m = outbound("orders", 2, 41, b"body", "TagA", ("k1",), "01ABC", props, NOW_MS - 9, NOW_MS,
                 delivery_attempt=2, receipt_handle="rh", invisible_ms=30_000)
    sp = m.system_properties
    assert (m.topic.name, m.body, sp.tag, list(sp.keys), sp.message_id) == \
        ("orders", b"body", "TagA", ["k1"], "01ABC")
    assert (sp.queue_id, sp.queue_offset, sp.delivery_attempt, sp.receipt_handle) == (2, 41, 2, "rh")
    assert sp.message_type == pb.MessageType.FIFO and sp.message_group == "g1"
    assert sp.born_host == "10.0.0.7" and sp.born_timestamp.ToMilliseconds() == NOW_MS - 9
    assert dict(m.user_properties) == {"color": "red"}


def test_a_bodys_digest_is_md5_in_upper_case_hex_as_rocketmqs_proxy_gives_it() -> None:
    """RocketMQ's proxy sends MD5 (``BinaryUtil.generateMd5``: upper-case hex), which every
    official client checks as such; a CRC32 in hex the Node.js client compares with its decimal
    text and marks the message corrupted. The Python client's own check accepts it."""
    from rocketmq.v5.model import Message as RmqMessage
    for body in (b"body", b"\x00\xff" * 700, "é".encode()):
        m = outbound("orders", 0, 0, body, "", (), "01ABC", (), NOW_MS, NOW_MS)
        digest = m.system_properties.body_digest
        assert (digest.type, digest.checksum) == (pb.DigestType.MD5,
                                                  hashlib.md5(body).hexdigest().upper())
        assert not RmqMessage().fromProtobuf(m).corrupted


def test_client_errors_map_to_protocol_codes() -> None:
    assert code_of(errors.TopicNotFoundError("t")) == pb.Code.TOPIC_NOT_FOUND
    assert code_of(errors.OverloadedError("busy")) == pb.Code.TOO_MANY_REQUESTS
    assert code_of(errors.MessageTooLargeError("big")) == pb.Code.MESSAGE_BODY_TOO_LARGE
    assert code_of(RuntimeError("?")) == pb.Code.INTERNAL_SERVER_ERROR


def test_the_broker_apis_named_errors_map_to_protocol_codes() -> None:
    """In process (the broker's and the log's named errors) and from a leader a request was
    forwarded to (``RemoteError`` with the broker's code), the same code for the same refusal."""
    from protocol.broker_errors import BadDelayError, BadRequestError, InvalidTopicError
    from protocol.broker_kinds import MessageTooLargeError, SendRefusedError
    from protocol.envelope import RemoteError
    from protocol.errors import (
        LeadershipLostError,
        NodeStoppedError,
        NotLeaderError,
        OverloadedError,
        ProposalTimeoutError,
    )
    from protocol.group_client import UnavailableError

    for code, err in ((pb.Code.TOPIC_NOT_FOUND, SendRefusedError("TOPIC_NOT_FOUND", "t")),
                      (pb.Code.FORBIDDEN, SendRefusedError("NO_PERMISSION", "t")),
                      (pb.Code.INVALID_RECEIPT_HANDLE,
                       SendRefusedError("INVALID_RECEIPT_HANDLE", "stale")),
                      (pb.Code.MESSAGE_BODY_TOO_LARGE, MessageTooLargeError("big")),
                      (pb.Code.ILLEGAL_TOPIC, InvalidTopicError("%SYS")),
                      (pb.Code.ILLEGAL_DELIVERY_TIME, BadDelayError("far")),
                      (pb.Code.BAD_REQUEST, BadRequestError("POP_ACK: receipts")),
                      (pb.Code.INVALID_TRANSACTION_ID, SendRefusedError("TXN_NOT_FOUND", "x"))):
        assert code_of(err) == code, err
        assert code_of(RemoteError(str(err.code), str(err))) == code, err
    assert code_of(NotLeaderError("n1", 3)) == pb.Code.HA_NOT_AVAILABLE
    assert code_of(NodeStoppedError("stopping")) == pb.Code.HA_NOT_AVAILABLE
    assert code_of(UnavailableError("no leader answered")) == pb.Code.HA_NOT_AVAILABLE
    assert code_of(OverloadedError("full")) == pb.Code.TOO_MANY_REQUESTS
    assert code_of(ProposalTimeoutError("late")) == pb.Code.PROXY_TIMEOUT
    assert code_of(LeadershipLostError("lost")) == pb.Code.PROXY_TIMEOUT
    assert code_of(RemoteError("SOMETHING_NEW", "?")) == pb.Code.INTERNAL_SERVER_ERROR


def test_an_unexpected_failure_is_answered_internal_server_error_not_unknown() -> None:
    import asyncio

    from rocketmq.grpc_protocol import service_pb2 as sv

    from broker.frontends.grpc.codec import guarded

    class Broken:
        @guarded(sv.HeartbeatResponse)
        async def Heartbeat(self, request: Any, context: Any) -> Any:
            raise KeyError("a bug")

    answer = asyncio.run(Broken().Heartbeat(sv.HeartbeatRequest(), None))
    assert answer.status.code == pb.Code.INTERNAL_SERVER_ERROR and "KeyError" in answer.status.message
