"""Decoding of API request bodies: JSON parsing and typed field access with Go-like strictness.

Owns the rules of docs/toxiproxy.md: bodies are JSON whatever the Content-Type, unknown keys
are ignored, a missing or null field keeps its default, and a type mismatch (including a
non-integer number where an integer is expected) is a 400 ``bad request body: ...``. Every
failure raises ``BadRequestError``; nothing here knows about proxies, sockets or HTTP.
"""

from __future__ import annotations

import json
from typing import Any

from chaos.toxiproxy.errors import BadRequestError

INT64_MIN = -(2 ** 63)
INT64_MAX = 2 ** 63 - 1

_JSON_TYPE_NAMES = {bool: "bool", int: "number", float: "number", str: "string", list: "array",
                    dict: "object", type(None): "null"}


def bad_body(detail: str) -> BadRequestError:
    return BadRequestError(f"bad request body: {detail}")


def parse_body(raw: bytes) -> Any:
    """Parse a request body as JSON; an empty body is ``EOF`` like Go's decoder reports it."""
    if not raw.strip():
        raise bad_body("EOF")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad_body(str(exc)) from exc


def _mismatch(value: Any, key: str, go_type: str) -> BadRequestError:
    json_type = _JSON_TYPE_NAMES.get(type(value), "value")
    return bad_body(f"json: cannot unmarshal {json_type} into field {key} of type {go_type}")


def require_object(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _mismatch(body, what, "object")
    return body


def require_array(body: Any, what: str) -> list[Any]:
    if not isinstance(body, list):
        raise _mismatch(body, what, "array")
    return body


def get_str(obj: dict[str, Any], key: str, default: str) -> str:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise _mismatch(value, key, "string")
    return value


def get_bool(obj: dict[str, Any], key: str, default: bool) -> bool:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _mismatch(value, key, "bool")
    return value


def get_float(obj: dict[str, Any], key: str, default: float) -> float:
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _mismatch(value, key, "float32")
    return float(value)


def get_int(obj: dict[str, Any], key: str, default: int) -> int:
    """An integer field: ``100.0`` and ``1e3`` are rejected, as Go rejects them for int64."""
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _mismatch(value, key, "int64")
    if not INT64_MIN <= value <= INT64_MAX:
        raise bad_body(f"json: cannot unmarshal number {value} into field {key} of type int64")
    return value


def get_object(obj: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _mismatch(value, key, "object")
    return value


__all__ = ["bad_body", "get_bool", "get_float", "get_int", "get_object", "get_str", "parse_body",
           "require_array", "require_object"]
