"""The envelope of every broker log entry and the checks its fields share.

An entry is a CBOR array ``[VERSION, KIND, ...fields]``; decoding is strict, so a malformed
committed entry is refused alike on every replica (never crashes one). Owns the envelope
(``dump``, ``envelope``), the field checks (``as_int``, ``as_str``, ``as_bool``, ``as_pairs``) and
a message in entry form: ``[body, tags, [keys], unique_key, [[name, value]], born_ts_ms]``
(``check_message``, ``message_of``, ``Message``). Which kinds exist and what each does is the
registry's (``broker.core.registry``). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cbor2

from protocol.broker_errors import BadEntryError
from protocol.broker_kinds import INT_MAX

__all__ = ["INT_MAX", "VERSION", "Message", "as_bool", "as_int", "as_pairs", "as_str",
           "check_message", "dump", "envelope", "message_of", "wire_messages"]

VERSION = 1


@dataclass(frozen=True, slots=True)
class Message:
    body: bytes
    tags: str = ""
    keys: tuple[str, ...] = ()
    unique_key: str = ""  # RocketMQ's UNIQ_KEY, set by the client: a retried send reuses it
    properties: tuple[tuple[str, str], ...] = ()
    born_ts_ms: int = 0


def dump(kind: int, fields: list[Any]) -> bytes:
    """An entry's payload: ``[VERSION, kind, *fields]``."""
    return cbor2.dumps([VERSION, kind, *fields])


def envelope(payload: bytes) -> tuple[Any, list[Any]]:
    """(kind, the fields after it) of an entry's payload; BadEntryError if it is not one."""
    try:
        arr = cbor2.loads(payload)
    except Exception as err:
        raise BadEntryError(f"not CBOR: {err}") from err
    if not isinstance(arr, list) or len(arr) < 2 or arr[0] != VERSION:
        raise BadEntryError("not a broker entry of this version")
    return arr[1], arr[2:]


def as_int(v: Any, lo: int = 0, what: str = "the field") -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= INT_MAX:
        raise ValueError(f"{what} must be an integer in {lo}..{INT_MAX}, not {v!r}")
    return v


def as_str(v: Any, what: str = "the field") -> str:
    if not isinstance(v, str):
        raise ValueError(f"{what} must be a string, not {type(v).__name__}")
    return v


def as_bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"expected a bool, got {type(v).__name__}")
    return v


def as_pairs(v: Any, shape: str) -> list[list[Any]]:
    """A list of two-item lists (``shape`` names them in the error)."""
    if not isinstance(v, list) or any(type(p) is not list or len(p) != 2 for p in v):
        raise ValueError(f"expected a list of {shape}")
    return v


def check_message(m: Any) -> None:
    """Raise ValueError/TypeError where ``message_of`` would; the common shape (a list, no keys,
    no properties) is checked without building anything. The leader runs it on every message it
    accepts, so that no replica refuses what the leader proposed."""
    if type(m) is list and len(m) == 6:
        body, tags, keys, unique_key, props, born = m
        if (type(body) is bytes and type(tags) is str and type(unique_key) is str
                and type(born) is int and 0 <= born <= INT_MAX and type(keys) is list and not keys
                and type(props) is list and not props):
            return
    message_of(m)  # the full check: raises on anything it refuses
    if type(m) is not list:
        raise ValueError("a message must be a list")


def message_of(m: Any) -> Message:
    """A message in entry form as a ``Message``, every field checked."""
    body, tags, keys, unique_key, props, born = m
    if not isinstance(body, bytes):
        raise ValueError("message body must be bytes")
    if not isinstance(keys, list) or not isinstance(props, list):
        raise ValueError("message keys and properties must be lists")
    # the common message has no keys and no properties: skip building and checking them
    keys_t = tuple(as_str(k, "a key") for k in keys) if keys else ()
    props_t = tuple((as_str(k, "a property name"), as_str(v, f"property {k!r}")) for k, v in props
                    ) if props else ()
    return Message(body, as_str(tags, "tags"), keys_t, as_str(unique_key, "the unique key"),
                   props_t, as_int(born, what="born_ts_ms"))


def wire_messages(messages: tuple[Message, ...]) -> list[list[Any]]:
    """``Message`` objects in entry form."""
    return [[m.body, m.tags, list(m.keys), m.unique_key, [list(p) for p in m.properties],
             m.born_ts_ms] for m in messages]
