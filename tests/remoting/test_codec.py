"""The remoting protocol's pure half (``protocol.remoting``): commands in both header forms, the
property string, batch bodies, stored-message records and message ids; and what arbitrary bytes
do to the decoders (a named error, nothing else)."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.remoting import codes, loose_json
from protocol.remoting.command import HEADER_BYTES_MAX, Command, RemotingFrameError, decode, encode
from protocol.remoting.record import (
    BatchMessage,
    RecordError,
    StoredRecord,
    decode_batch,
    decode_records,
    encode_batch,
    encode_record,
    join_properties,
    offset_msg_id_4x,
    parse_offset_msg_id_4x,
    split_properties,
)

names = st.text(st.characters(blacklist_characters="\x01\x02\x00", blacklist_categories=("Cs",)),
                min_size=1, max_size=20)
values = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
                 max_size=40)


@given(code=st.integers(-(2**15), 2**15 - 1), opaque=st.integers(-(2**31), 2**31 - 1),
       flag=st.integers(0, 3), remark=values, ext=st.dictionaries(names, values, max_size=8),
       body=st.binary(max_size=64), form=st.sampled_from([codes.JSON, codes.ROCKETMQ]))
def test_a_command_decodes_to_what_was_encoded(code: int, opaque: int, flag: int, remark: str,
                                               ext: dict[str, str], body: bytes,
                                               form: int) -> None:
    back = decode(encode(Command(code, opaque, flag, remark, ext, body, serialization=form)))
    assert (back.code, back.opaque, back.flag, back.remark, back.ext, back.body,
            back.serialization) == (code, opaque, flag, remark, ext, body, form)


@settings(max_examples=400)
@given(st.binary(max_size=300))
def test_arbitrary_payloads_decode_or_raise_a_named_error(data: bytes) -> None:
    for payload in (data, struct.pack(">I", len(data)) + data,
                    struct.pack(">I", (1 << 24) | len(data)) + data):
        try:
            decode(payload)
        except RemotingFrameError:
            pass


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_arbitrary_batch_bodies_and_records_decode_or_raise_a_named_error(data: bytes) -> None:
    for decoder in (decode_batch, decode_records):
        try:
            decoder(data)
        except RecordError:
            pass


def test_a_header_over_the_limit_or_past_the_frame_is_refused_by_name() -> None:
    with pytest.raises(RemotingFrameError, match="exceeds"):
        decode(struct.pack(">I", HEADER_BYTES_MAX + 1) + b" " * (HEADER_BYTES_MAX + 1))
    with pytest.raises(RemotingFrameError, match="runs past"):
        decode(struct.pack(">I", 10) + b"{}")
    with pytest.raises(RemotingFrameError, match="serialization"):
        decode(struct.pack(">I", (9 << 24) | 2) + b"{}")
    with pytest.raises(RemotingFrameError, match="32-bit"):
        decode(struct.pack(">I", 14) + b'{"code":"x1"}' + b" ")


@given(tags=values.filter(lambda t: t.strip() == t), keys=st.lists(
    names.filter(lambda k: " " not in k), max_size=3), unique=names,
    props=st.lists(st.tuples(names.filter(lambda n: n not in ("TAGS", "KEYS", "UNIQ_KEY")),
                             values), max_size=4))
def test_the_property_string_carries_tags_keys_and_properties(
        tags: str, keys: list[str], unique: str, props: list[tuple[str, str]]) -> None:
    text = join_properties(tags, keys, unique, props)
    assert split_properties(text) == (tags, keys, unique, [list(p) for p in props])


def test_a_batch_and_a_record_decode_to_what_was_encoded() -> None:
    batch = [BatchMessage(0, b"one", join_properties("a", ["k"], "u1", [])),
             BatchMessage(3, b"", join_properties("", [], "u2", [["x", "y"]]))]
    assert decode_batch(encode_batch(batch)) == batch
    record = StoredRecord("t", 2, 41, 7 << 20 | 3, b"body", "TAGS\x01a\x02", 11, 22,
                          ("127.0.0.1", 30911), ("10.0.0.1", 5), reconsume_times=2)
    assert decode_records(encode_record(record) * 2) == [record, record]


def test_a_4x_message_id_leads_back_to_the_node_and_the_message() -> None:
    text = offset_msg_id_4x(("127.0.0.1", 30911), 123_456, 42)
    assert len(text) == 32 and text == text.upper()
    assert parse_offset_msg_id_4x(text) == (("127.0.0.1", 30911), 123_456, 42)
    for bad in ("", "zz" * 16, "00" * 15, "7F000001000078BF" + "F" * 16):
        with pytest.raises(RecordError):
            parse_offset_msg_id_4x(bad)


def test_a_number_that_is_no_ascii_digit_or_a_lone_surrogate_is_a_frame_error() -> None:
    for header in (b'{"code":"\\u00b2"}', b'{"code":1,"extFields":{"a":"\\ud800"}}',
                   b'{"code":1,"remark":"\\udfff"}', b'{"code":"' + b"9" * 5000 + b'"}'):
        with pytest.raises(RemotingFrameError):
            decode(struct.pack(">I", len(header)) + header)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=20))
def test_loose_json_reads_json_as_json(value: object) -> None:
    assert loose_json.loads(json.dumps(value, indent=1)) == value


def test_loose_json_reads_object_keys_and_refuses_the_malformed() -> None:
    text = '{"mqTable":{{"topic":"t","queueId":0}:{"commitOffset":"1"}},"jstack":""}'
    assert loose_json.loads(text) == {
        "mqTable": [{"key": {"topic": "t", "queueId": 0}, "value": {"commitOffset": "1"}}],
        "jstack": ""}
    for bad in ("{", '{"a"}', "[1,", "{}x", "[" * 100 + "]" * 100, '{"a":1,}'):
        with pytest.raises(ValueError):
            loose_json.loads(bad)
