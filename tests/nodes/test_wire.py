"""Framing and codec of the peer wire protocol: round trips, any chunking, hostile input."""

from __future__ import annotations

import dataclasses
import itertools
import struct

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dledger.network.wire import (
    KIND_APPEND_REQUEST,
    KIND_HEARTBEAT,
    KIND_HELLO,
    Hello,
    decode_message,
    encode_message,
)
from dledger.raft.types import (
    AppendRequest,
    AppendResponse,
    Entry,
    EntryKind,
    Heartbeat,
    HeartbeatResponse,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from protocol.errors import FrameTooLargeError, WireError
from protocol.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    VERSION,
    FrameDecoder,
    decode_payload,
    encode_frame,
    encode_payload,
)

U64_MAX = 2**64 - 1

# --- strategies ---------------------------------------------------------------------------

u64 = st.integers(min_value=0, max_value=U64_MAX)
small = st.integers(min_value=0, max_value=1000)
number = st.one_of(small, u64)
node = st.text(max_size=12)
flag = st.booleans()
entry = st.builds(Entry, number, number, st.sampled_from(EntryKind), st.binary(max_size=2048))
entries = st.lists(entry, max_size=16).map(tuple)  # both sides of wire._SMALL_BATCH_ITEMS

messages = st.one_of(
    st.builds(VoteRequest, number, node, node, number, number, flag, flag),
    st.builds(VoteResponse, number, node, node, flag, flag),
    st.builds(AppendRequest, number, node, node, number, number, entries, number),
    st.builds(AppendResponse, number, node, node, flag, number, number, number),
    st.builds(Heartbeat, number, node, node, number, number),
    st.builds(HeartbeatResponse, number, node, node),
    st.builds(TimeoutNow, number, node, node),
    st.builds(Hello, node, node),
)

EXAMPLES = [
    VoteRequest(3, "n1", "n2", 10, 2, pre_vote=True, transfer=False),
    VoteResponse(3, "n2", "n1", granted=True, pre_vote=False),
    AppendRequest(3, "n1", "n2", 10, 2, (), 9),
    AppendRequest(
        3, "n1", "n2", 10, 2,
        (Entry(11, 3, EntryKind.NOOP, b""), Entry(12, 3, EntryKind.NORMAL, b"x" * 5000)), 11,
    ),
    AppendResponse(3, "n2", "n1", False, 10, conflict_term=2, conflict_index=7),
    Heartbeat(3, "n1", "n2", commit=9, retain_index=4),
    HeartbeatResponse(3, "n2", "n1"),
    TimeoutNow(3, "n1", "n2"),
    Hello("group-a", "n1"),
]


def raw(*fields: object) -> bytes:
    """A payload from raw fields, bypassing the encoder (for malformed input)."""
    return cbor2.dumps(list(fields))


# --- codec round trips --------------------------------------------------------------------


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_type_round_trips(msg: object) -> None:
    decoded = decode_message(encode_message(msg))  # type: ignore[arg-type]
    assert decoded == msg
    assert type(decoded) is type(msg)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(messages)
def test_any_message_round_trips_through_a_frame(msg: object) -> None:
    frame = encode_frame(encode_message(msg))  # type: ignore[arg-type]
    (payload,) = FrameDecoder(DEFAULT_MAX_FRAME_BYTES).feed(frame)
    assert decode_message(payload) == msg


def test_decoded_entries_are_real_entries() -> None:
    msg = EXAMPLES[3]
    decoded = decode_message(encode_message(msg))
    assert isinstance(decoded, AppendRequest)
    for got, want in zip(decoded.entries, msg.entries):  # type: ignore[union-attr]
        assert type(got) is Entry and type(got.kind) is EntryKind
        assert got == want and hash(got) == hash(want)
        with pytest.raises(dataclasses.FrozenInstanceError):
            got.index = 5  # type: ignore[misc]


def test_large_entries_round_trip() -> None:
    big = tuple(Entry(i, 7, EntryKind.NORMAL, bytes([i]) * (1 << 20)) for i in range(1, 4))
    msg = AppendRequest(7, "a", "b", 0, 0, big, 3)
    assert decode_message(encode_message(msg)) == msg


def test_hello_is_a_frozen_slotted_value() -> None:
    hello = Hello("g", "n1")
    assert not hasattr(hello, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        hello.group = "h"  # type: ignore[misc]


def test_encode_rejects_non_messages() -> None:
    with pytest.raises(TypeError):
        encode_message("not a message")  # type: ignore[arg-type]


def test_generic_payload_round_trip_for_other_protocols() -> None:
    payload = encode_payload(64, ["topic", 3, b"body", True, None, [1, 2]])
    assert decode_payload(payload) == (64, ["topic", 3, b"body", True, None, [1, 2]])
    assert decode_payload(encode_payload(70, [])) == (70, [])


def test_generic_payload_checks_version_and_shape() -> None:
    for bad in (raw(2, 64, "x"), raw(True, 64), raw(1), raw(1, -1), raw(1, "k"), cbor2.dumps(5)):
        with pytest.raises(WireError):
            decode_payload(bad)


# --- strict decoding ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (raw(2, KIND_HEARTBEAT, 1, "a", "b", 0, 0), "version"),
        (raw(0, KIND_HEARTBEAT, 1, "a", "b", 0, 0), "version"),
        (raw(True, KIND_HEARTBEAT, 1, "a", "b", 0, 0), "version"),
        (raw(VERSION, 99, 1, "a", "b"), "unknown"),
        (raw(VERSION, 64, 1, "a", "b"), "unknown"),
        (raw(VERSION, True, 1, "a", "b"), "kind"),  # True == 1 but is not the kind 1
        (raw(VERSION, KIND_HEARTBEAT, 1, "a", "b", 0), "expected 5 fields"),
        (raw(VERSION, KIND_HEARTBEAT, 1, "a", "b", 0, 0, 0), "expected 5 fields"),
        (raw(VERSION, KIND_HEARTBEAT, True, "a", "b", 0, 0), "term must be int"),
        (raw(VERSION, KIND_HEARTBEAT, 1, b"a", "b", 0, 0), "src must be str"),
        (raw(VERSION, KIND_HEARTBEAT, 1, "a", None, 0, 0), "dst must be str"),
        (raw(VERSION, KIND_HEARTBEAT, 1, "a", "b", 1.0, 0), "commit must be int"),
        (raw(VERSION, KIND_HEARTBEAT, -1, "a", "b", 0, 0), "term must be in"),
        (raw(VERSION, KIND_HEARTBEAT, 1, "a", "b", 0, -5), "retain_index must be in"),
        (raw(VERSION, KIND_HEARTBEAT, 2**64, "a", "b", 0, 0), "term must be in"),
        (raw(VERSION, 4, 1, "a", "b", 1, 5, 0, 0), "success must be bool"),
        (raw(VERSION, 2, 1, "a", "b", "yes", False), "granted must be bool"),
        (raw(VERSION, KIND_HELLO, "g", 7, ""), "node_id must be str"),
        (cbor2.dumps({"version": 1}), "CBOR array"),
        (cbor2.dumps([]), "CBOR array"),
        (cbor2.dumps("hello"), "CBOR array"),
        (b"\xff\xfe\xfd", "undecodable"),
        (b"", "undecodable"),
        (raw(VERSION, KIND_HEARTBEAT, 1, "a", "b", 0, 0) + b"\x00", "trailing"),
    ],
)
def test_malformed_payloads_raise_wire_error_saying_why(payload: bytes, why: str) -> None:
    with pytest.raises(WireError, match=why):
        decode_message(payload)


def append_with(flat_entries: list[object]) -> bytes:
    return raw(VERSION, KIND_APPEND_REQUEST, 1, "a", "b", 0, 0, flat_entries, 0)


@pytest.mark.parametrize(
    ("flat_entries", "why"),
    [
        ([1, 1, 0], "multiple of 4"),
        ([1, 1, 0, "data"], "entry 0 must be"),
        ([1, 1, 0, b"", 2, 1, 0, None], "entry 1 must be"),
        ([1, 1, True, b""], "entry 0 must be"),
        ([1, False, 0, b""], "entry 0 must be"),
        ([-1, 1, 0, b""], "entry 0: index -1"),
        ([1, 1, 0, b"", 2, -3, 0, b""], "entry 1: index 2 or term -3"),
        ([1, 1, 3, b""], "unknown entry kind 3"),
        ([1, 1, -1, b""], "unknown entry kind -1"),
        ([2**64, 1, 0, b""], "out of range"),
        ([[1, 1, 0, b""]], "multiple of 4"),  # the nested layout is not ours
        ([[1, 1, 0, b""], 1, 1, b""], "entry 0 must be"),
    ],
)
@pytest.mark.parametrize("valid_after", [0, 5])  # few entries: a loop; many: column checks
def test_malformed_entries_raise_wire_error(flat_entries: list[object], why: str,
                                            valid_after: int) -> None:
    padding = [x for k in range(valid_after) for x in (10 + k, 1, 0, b"ok")]
    with pytest.raises(WireError, match=why):
        decode_message(append_with(flat_entries + padding))


def test_entries_must_be_an_array() -> None:
    with pytest.raises(WireError, match="entries must be list"):
        decode_message(raw(VERSION, KIND_APPEND_REQUEST, 1, "a", "b", 0, 0, b"", 0))


def test_bignum_and_tagged_values_are_rejected() -> None:
    for value in (2**70, -(2**70), cbor2.CBORTag(1, 0), cbor2.CBORTag(9999, "x")):
        with pytest.raises(WireError):
            decode_message(raw(VERSION, KIND_HEARTBEAT, value, "a", "b", 0, 0))


def test_every_truncation_of_a_valid_payload_is_rejected() -> None:
    payload = encode_message(EXAMPLES[3])
    for cut in range(len(payload)):
        with pytest.raises(WireError):
            decode_message(payload[:cut])


@settings(max_examples=500)
@given(st.binary(max_size=256))
def test_random_bytes_never_raise_anything_but_wire_error(data: bytes) -> None:
    try:
        decode_message(data)
    except WireError:
        pass
    try:
        decode_payload(data)
    except WireError:
        pass


cbor_values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80),
        st.floats(allow_nan=False), st.text(max_size=8), st.binary(max_size=8),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=20,
)


@settings(max_examples=500)
@given(st.integers(min_value=0, max_value=20), st.lists(cbor_values, max_size=10))
def test_random_fields_under_a_valid_header_never_raise_anything_but_wire_error(
    kind: int, fields: list[object]
) -> None:
    try:
        decode_message(raw(VERSION, kind, *fields))
    except WireError:
        pass


@settings(max_examples=300)
@given(messages, st.data())
def test_one_field_of_the_wrong_type_is_rejected(msg: object, data: st.DataObject) -> None:
    array = cbor2.loads(encode_message(msg))  # type: ignore[arg-type]
    pos = data.draw(st.integers(min_value=2, max_value=len(array) - 1))
    original_type = type(array[pos])
    array[pos] = data.draw(cbor_values.filter(lambda v: type(v) is not original_type))
    with pytest.raises(WireError):
        decode_message(cbor2.dumps(array))


# --- framing ------------------------------------------------------------------------------


def test_frame_is_a_big_endian_length_prefix() -> None:
    assert encode_frame(b"abc") == b"\x00\x00\x00\x03abc"
    with pytest.raises(WireError):
        encode_frame(b"")


def test_frames_fed_byte_by_byte() -> None:
    payloads = [encode_message(m) for m in EXAMPLES]
    stream = b"".join(encode_frame(p) for p in payloads)
    decoder = FrameDecoder(DEFAULT_MAX_FRAME_BYTES)
    got: list[bytes] = []
    for i in range(len(stream)):
        got += decoder.feed(stream[i : i + 1])
    assert got == payloads
    assert decoder.buffered_bytes == 0


def test_many_frames_in_one_chunk() -> None:
    payloads = [bytes([i]) * (i + 1) for i in range(200)]
    stream = b"".join(encode_frame(p) for p in payloads)
    assert FrameDecoder(1024).feed(stream) == payloads


@given(
    st.lists(st.binary(min_size=1, max_size=300), max_size=20),
    st.lists(st.integers(min_value=0, max_value=400), max_size=30),
)
def test_any_chunking_yields_the_same_payloads(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(p) for p in payloads)
    bounds = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    decoder = FrameDecoder(300)
    got: list[bytes] = []
    for lo, hi in itertools.pairwise(bounds):
        got += decoder.feed(stream[lo:hi])
    assert got == payloads
    assert decoder.buffered_bytes == 0


def test_frame_at_the_limit_passes_and_one_byte_more_is_too_large() -> None:
    assert FrameDecoder(10).feed(encode_frame(b"x" * 10)) == [b"x" * 10]
    decoder = FrameDecoder(10)
    with pytest.raises(FrameTooLargeError):
        decoder.feed(struct.pack(">I", 11))  # raised on the prefix alone, before the body
    with pytest.raises(FrameTooLargeError):
        decoder.feed(b"x")  # the stream is out of sync: the decoder stays failed


def test_oversized_prefix_after_good_frames_in_the_same_chunk() -> None:
    decoder = FrameDecoder(DEFAULT_MAX_FRAME_BYTES)
    with pytest.raises(FrameTooLargeError):
        decoder.feed(encode_frame(b"ok") + b"\xff\xff\xff\xff")


def test_zero_length_frame_is_a_wire_error() -> None:
    decoder = FrameDecoder(100)
    with pytest.raises(WireError, match="zero-length"):
        decoder.feed(encode_frame(b"a") + b"\x00\x00\x00\x00")


@settings(max_examples=300)
@given(st.binary(max_size=64), st.integers(min_value=1, max_value=64))
def test_random_bytes_into_the_frame_decoder_only_raise_wire_errors(
    data: bytes, max_frame_bytes: int
) -> None:
    decoder = FrameDecoder(max_frame_bytes)
    try:
        for payload in decoder.feed(data):
            assert 0 < len(payload) <= max_frame_bytes
    except WireError:
        pass
