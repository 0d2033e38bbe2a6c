"""The JSON that RocketMQ's clients write, which is not always JSON: a map keyed by objects (a
ConsumerRunningInfo's ``mqTable``, keyed by message queues) is written with the key object as
the key (``{{"topic": "t", "queueId": 0}: {...}}``). ``loads`` reads that form as well: an object
whose keys are all strings is a dict, any other a list of ``{"key": ..., "value": ...}``.
Bounded: nesting deeper than ``DEPTH_MAX`` is a ValueError, as is anything else malformed."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["DEPTH_MAX", "loads"]

DEPTH_MAX = 64
_SCALARS = json.JSONDecoder()
_WS = " \t\r\n"


def loads(text: str) -> Any:
    value, i = _value(text, _skip(text, 0), 0)
    if _skip(text, i) != len(text):
        raise ValueError(f"text after the value at {i}")
    return value


def _skip(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _value(s: str, i: int, depth: int) -> tuple[Any, int]:
    if depth > DEPTH_MAX:
        raise ValueError(f"nested deeper than {DEPTH_MAX}")
    if i >= len(s):
        raise ValueError("a value is missing at the end")
    if s[i] == "{":
        return _members(s, i, depth, "}")
    if s[i] == "[":
        return _members(s, i, depth, "]")
    value, end = _SCALARS.raw_decode(s, i)  # a string, number, true, false or null
    return value, end


def _members(s: str, i: int, depth: int, close: str) -> tuple[Any, int]:
    items: list[Any] = []
    pairs: list[tuple[Any, Any]] = []
    i = _skip(s, i + 1)
    if i < len(s) and s[i] == close:
        return ({} if close == "}" else []), i + 1
    while True:
        value, i = _value(s, i, depth + 1)
        i = _skip(s, i)
        if close == "}":
            if i >= len(s) or s[i] != ":":
                raise ValueError(f"':' expected at {i}")
            member, i = _value(s, _skip(s, i + 1), depth + 1)
            pairs.append((value, member))
            i = _skip(s, i)
        else:
            items.append(value)
        if i < len(s) and s[i] == ",":
            i = _skip(s, i + 1)
            continue
        if i < len(s) and s[i] == close:
            break
        raise ValueError(f"',' or {close!r} expected at {i}")
    if close == "]":
        return items, i + 1
    if all(isinstance(k, str) for k, _ in pairs):
        return dict(pairs), i + 1
    return [{"key": k, "value": v} for k, v in pairs], i + 1
