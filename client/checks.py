"""Checks of the values a caller passes as options: each raises ValueError with a message that
names the option, the range and the value given, so a constructor says at once what is wrong
(rather than a puller failing later). No state; nothing else."""

from __future__ import annotations

import math


def number(name: str, value: object, lo: float, hi: float | None = None, *,
           integer: bool = False) -> None:
    """A finite number (an int with ``integer``; never a bool) in ``lo..hi`` (None: no upper
    bound)."""
    n = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if n is None or (integer and not isinstance(n, int)) or not math.isfinite(n) \
            or not (lo <= n and (hi is None or n <= hi)):
        kind = "an int" if integer else "a number"
        bound = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} must be {kind} {bound}, not {value!r}")


def text(name: str, value: object) -> None:
    """A non-empty str."""
    if type(value) is not str or not value:
        raise ValueError(f"{name} must be a non-empty str, not {value!r}")


def flag(name: str, value: object) -> None:
    """A bool (not 0 or 1)."""
    if type(value) is not bool:
        raise ValueError(f"{name} must be a bool, not {value!r}")
