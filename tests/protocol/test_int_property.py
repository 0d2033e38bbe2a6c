"""Integer-valued message properties (``protocol.int_property``): a stored ``TTL_MS`` or
``PRIORITY`` that is not a decimal integer reads as none, never as an exception out of every
read of its queue (a pull, a pop's scan; a review found ``"--5"`` raising from ``int()``)."""

from __future__ import annotations

import pytest

from protocol.int_property import int_property, natural
from protocol.message_ttl import BadTtlError, expired, parse_ttl_ms, ttl_of
from protocol.priority import BadPriorityError, parse_priority, priority_of

NOT_INTEGERS = ["--5", "-", "", " ", "+5", "5.0", "0x10", "\u0663", "1_000", "9" * 5000, "5\n5"]


@pytest.mark.parametrize("text", NOT_INTEGERS)
def test_text_that_is_not_a_decimal_integer_is_none(text: str) -> None:
    assert int_property(text) is None


def test_integers_and_their_text() -> None:
    assert [int_property(v) for v in ("7", " 7 ", "-7", 7, "0")] == [7, 7, -7, 7, 0]
    assert int_property(True) is None and int_property(7.0) is None and int_property(None) is None


@pytest.mark.parametrize("text", NOT_INTEGERS)
def test_a_stored_message_with_such_a_ttl_or_priority_reads_as_without(text: str) -> None:
    assert ttl_of([["TTL_MS", text]]) is None
    assert not expired([["TTL_MS", text]], 0, 10**15)
    assert priority_of([["PRIORITY", text]]) == 0
    with pytest.raises(BadTtlError):
        parse_ttl_ms(text)
    with pytest.raises(BadPriorityError):
        parse_priority(text)


def test_a_natural_is_ascii_digits_and_nothing_else_within_its_length() -> None:
    assert [natural(v, 3) for v in ("0", "7", "042", "999")] == [0, 7, 42, 999]
    for odd in ("", "1000", "-1", " 7", "7 ", "+7", "\u00b2", "1\u00b2", "\u0663", "1e3", 7, None):
        assert natural(odd, 3) is None, odd
