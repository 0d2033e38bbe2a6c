"""The leader's scoping of unique keys (``broker.core.sendwire.scoped_key``): a message is
deduplicated under its sender's key and a digest of its content, so a retry is one message and
another message under the same key is another; consumers see the key as sent
(``protocol.broker_kinds.message_id``)."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from broker.core.sendwire import wire_messages
from protocol.broker_kinds import SCOPE_MARK, UNIQ_KEY, message_id, unscoped

MAX = 4 << 20


def scoped(m: list[Any]) -> str:
    return str(wire_messages("t", [m], MAX, False)[0][0][3])


def test_a_retry_is_scoped_alike_and_any_other_content_is_not() -> None:
    m = [b"body", "TagA", ["k1", "k2"], "KEY", [["p", "v"]], 1]
    assert scoped(m) == scoped([*m[:5], 2])  # the born time aside: a retry may stamp anew
    others = [[b"bodY", *m[1:]], [m[0], "TagB", *m[2:]], [*m[:2], ["k1"], *m[3:]],
              [*m[:4], [["p", "w"]], 1], [*m[:4], [], 1], [*m[:3], "KEY2", *m[4:]]]
    keys = {scoped(o) for o in others}
    assert len(keys) == len(others) and scoped(m) not in keys
    # the keys counted: two keys "" and no property, or no key and a property ("", "")
    assert scoped([b"", "", ["", ""], "K", [], 0]) != scoped([b"", "", [], "K", [["", ""]], 0])


def test_the_senders_rows_are_left_as_they_were() -> None:
    """A front end that sends its rows again (a retry to a new leader) sends the key as its
    client gave it: scoped twice, a retry would not be found."""
    raw = [[b"x", "", [], "KEY", [], 0], [b"y", "", [], "", [], 0]]
    before = copy.deepcopy(raw)
    out, _, _ = wire_messages("t", raw, MAX, False)
    assert raw == before
    assert out[0][3].startswith("KEY" + SCOPE_MARK) and out[1] == raw[1]  # no key: no dedup


@given(st.text(max_size=40), st.binary(max_size=64), st.text(max_size=8),
       st.lists(st.tuples(st.text(max_size=8), st.text(max_size=8)), max_size=3))
def test_consumers_see_the_key_as_sent(key: str, body: bytes, tags: str,
                                       props: list[tuple[str, str]]) -> None:
    pairs = [["x-" + name, value] for name, value in props]  # (no property the leader checks)
    stored = scoped([body, tags, [], key or "K", pairs, 0])
    assert unscoped(stored) == (key or "K")
    assert message_id(stored, pairs) == (key or "K")
    assert message_id(stored, [*pairs, [UNIQ_KEY, "4x-id"]]) == "4x-id"  # a copy's, a 4.x send's


def test_keys_stored_before_the_leaders_scoped_them_read_unchanged() -> None:
    for old in ("0A1B2C3D4E5F60718293A4B5C6D7E8F9", "group-0000000000001234-0#2", "a#b#c",
                "a\x1fb", "\x1f" + "0" * 16):
        assert message_id(old, []) == old


def _reference(m: list[Any]) -> str:
    """The digest's one format, written out: the counts, each string length-prefixed, the body."""
    body, tags, keys, key, props, _ = m
    head = len(keys).to_bytes(4, "little") + len(props).to_bytes(4, "little")
    for text in (tags, *keys, *(x for p in props for x in p)):
        data = text.encode("utf-8", "surrogatepass")
        head += len(data).to_bytes(4, "little") + data
    digest = hashlib.blake2b(head + body, digest_size=8, person=b"dledger-uniq").hexdigest()
    return f"{key}{SCOPE_MARK}{digest}"


@given(st.binary(max_size=32), st.text(max_size=6), st.lists(st.text(max_size=4), max_size=2),
       st.lists(st.tuples(st.text(max_size=4), st.text(max_size=4)), max_size=2))
def test_every_shape_of_message_is_digested_in_one_format(
        body: bytes, tags: str, keys: list[str], props: list[tuple[str, str]]) -> None:
    """The shortcuts (no tags, keys or properties; tags alone) read as the general form does,
    and a head that ends where its counts say leaves no content read as another: the body
    cannot pass for tags, nor keys for properties."""
    m = [body, tags, keys, "K", [["x-" + n, v] for n, v in props], 0]
    assert scoped(m) == _reference(m)
    assert scoped([b"xy", "", [], "K", [], 0]) != scoped([b"y", "x", [], "K", [], 0])
