"""Integer-valued message properties (``TTL_MS``, ``PRIORITY``): a value read as an integer the
same way on every path and every replica, or refused. Property values arrive as text from every
client, so the text is checked here before ``int()`` sees it: ASCII digits with an optional
minus (``"--5"``, ``"٣"`` and a 5,000-digit string are refused, not raised from ``int()``).
"""

from __future__ import annotations

import re

_DECIMAL = re.compile(r"-?[0-9]{1,19}")  # (19 digits: within a signed 64-bit integer's reach)


def int_property(value: object) -> int | None:
    """``value`` as an int (an int, or its decimal text, spaces around it allowed); None if it
    is neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return None
    text = value.strip()
    return int(text) if _DECIMAL.fullmatch(text) else None


def natural(value: object, max_digits: int) -> int | None:
    """``value`` as a non-negative int if it is text of 1..``max_digits`` ASCII digits and
    nothing else (no sign, no spaces: the broker's own fields, and those whose refusal every
    replica must reach alike); None otherwise (``isdigit()`` alone passes "²", which ``int()``
    refuses, and "٣", which it reads)."""
    if not isinstance(value, str) or not 0 < len(value) <= max_digits:
        return None
    return int(value) if value.isascii() and value.isdigit() else None


__all__ = ["int_property", "natural"]
