"""Message is checked and normalised when it is built (issue 16 item 11): one key given as a str is
one key (a str of keys splits on whitespace, RocketMQ's KEY_SEPARATOR form), a message has one
tag, properties come as a dict or pairs of str, a str body must be encoded by the caller."""

from __future__ import annotations

import pytest

from client import Message


def test_one_key_given_as_a_str_is_one_key() -> None:
    assert Message("t", b"x", keys="order-42").keys == ("order-42",)
    assert Message("t", b"x", keys="a  b\tc").keys == ("a", "b", "c")  # KEY_SEPARATOR form
    assert Message("t", b"x", keys=["a b", "c"]).keys == ("a b", "c")  # a sequence: as given
    assert Message("t", b"x", keys=("k",)).keys == ("k",)
    assert Message("t", b"x").keys == ()
    with pytest.raises(TypeError, match="keys must be str"):
        Message("t", b"x", keys=[42])  # type: ignore[list-item]


def test_a_message_has_one_tag() -> None:
    assert Message("t", b"x", tags="TagA").tags == "TagA"
    with pytest.raises(TypeError, match="tags must be one str"):
        Message("t", b"x", tags=["TagA", "TagB"])  # type: ignore[arg-type]


def test_properties_are_a_dict_or_pairs_of_str() -> None:
    want = (("region", "eu"), ("tier", "gold"))
    assert Message("t", b"x", properties={"region": "eu", "tier": "gold"}).properties == want
    assert Message("t", b"x", properties=[["region", "eu"], ("tier", "gold")]).properties == want  # type: ignore[list-item]
    assert Message("t", b"x", properties=iter(want)).properties == want
    with pytest.raises(TypeError, match=r"must be str: 'n': 5"):
        Message("t", b"x", properties={"n": 5})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="must be str"):
        Message("t", b"x", properties={7: "v"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="pairs or a dict"):
        Message("t", b"x", properties=["region=eu"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="twice"):
        Message("t", b"x", properties=[("a", "1"), ("a", "2")])


def test_the_body_is_bytes_and_a_str_must_be_encoded() -> None:
    with pytest.raises(TypeError, match="encode it"):
        Message("t", "hello")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be bytes"):
        Message("t", None)  # type: ignore[arg-type]
    assert Message("t", bytearray(b"ab")).body == b"ab"
    assert type(Message("t", memoryview(b"ab")).body) is bytes
    with pytest.raises(TypeError, match="topic must be a str"):
        Message(b"t", b"x")  # type: ignore[arg-type]


def test_messages_stay_frozen_and_hashable() -> None:
    a = Message("t", b"x", "tag", "k1 k2", {"p": "v"})
    b = Message("t", b"x", "tag", ("k1", "k2"), [("p", "v")])
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    with pytest.raises(AttributeError):
        a.tags = "other"  # type: ignore[misc]
    assert repr(a).startswith("Message(topic='t', body=b'x', tags='tag', keys=('k1', 'k2')")
