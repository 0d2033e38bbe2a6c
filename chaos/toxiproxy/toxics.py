"""Toxic definitions: the types, their attributes, request decoding and JSON shape.

Owns what a toxic *is* (docs/toxiproxy.md): the attribute names of each type
(all integers, defaulting to 0), the default name ``<type>_<stream-as-sent>``, the float32
toxicity, the merge rule of updates, and the value checks for inputs that crash Go's server
(negative bandwidth, a slicer that never stops slicing). It does not run toxics: the data plane
behaviour lives in ``behaviours``.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

from chaos.toxiproxy.decode import bad_body, get_float, get_int, get_object, get_str, require_object
from chaos.toxiproxy.errors import BadRequestError

UPSTREAM = "upstream"
DOWNSTREAM = "downstream"
STREAMS = (UPSTREAM, DOWNSTREAM)

# Attribute names in the order Go's structs declare (and so serialise) them.
ATTRIBUTE_NAMES: dict[str, tuple[str, ...]] = {
    "noop": (),
    "latency": ("latency", "jitter"),
    "bandwidth": ("rate",),
    "slow_close": ("delay",),
    "timeout": ("timeout",),
    "reset_peer": ("timeout",),
    "slicer": ("average_size", "size_variation", "delay"),
    "limit_data": ("bytes",),
}
TOXIC_TYPES = tuple(ATTRIBUTE_NAMES)


def to_float32(value: float) -> float:
    """Round to the nearest float32, as Go stores ``toxicity``."""
    try:
        rounded: float = struct.unpack("<f", struct.pack("<f", value))[0]
        return rounded
    except (OverflowError, struct.error) as exc:
        raise bad_body(f"json: cannot unmarshal number {value} into field toxicity of type float32") \
            from exc


def float32_json(value: float) -> int | float:
    """The shortest number that reads back as the same float32: ``1`` for 1.0, ``0.2`` for 0.2."""
    if value.is_integer() and abs(value) < 1e21:
        return int(value)
    for digits in range(1, 10):
        text = f"{value:.{digits}g}"
        if to_float32(float(text)) == value:
            return float(text)
    return value


@dataclasses.dataclass(frozen=True)
class ToxicSpec:
    """One configured toxic of a proxy. ``stream`` is kept exactly as the client sent it."""

    name: str
    type: str
    stream: str
    toxicity: float
    attributes: dict[str, int]

    @property
    def direction(self) -> str:
        """``upstream`` or ``downstream``: the stream matched case-insensitively."""
        return self.stream.lower()

    def to_json(self) -> dict[str, Any]:
        return {"attributes": dict(self.attributes), "name": self.name, "type": self.type,
                "stream": self.stream, "toxicity": float32_json(self.toxicity)}


@dataclasses.dataclass(frozen=True)
class ToxicRequest:
    """A decoded ``POST /proxies/{p}/toxics`` body whose attributes are not yet checked."""

    name: str
    type: str
    stream: str
    toxicity: float
    raw_attributes: dict[str, Any] | None


def decode_create(body: Any) -> ToxicRequest:
    """Decode a create request, checking body, stream and type in Toxiproxy's order."""
    obj = require_object(body, "toxic")
    name = get_str(obj, "name", "")
    toxic_type = get_str(obj, "type", "")
    stream = get_str(obj, "stream", "") or DOWNSTREAM
    toxicity = to_float32(get_float(obj, "toxicity", 1.0))
    raw_attributes = get_object(obj, "attributes")
    if stream.lower() not in STREAMS:
        raise BadRequestError("stream was invalid, can be either upstream or downstream")
    if toxic_type not in ATTRIBUTE_NAMES:
        raise BadRequestError("invalid toxic type")
    return ToxicRequest(name=name or f"{toxic_type}_{stream}", type=toxic_type, stream=stream,
                        toxicity=toxicity, raw_attributes=raw_attributes)


def build(request: ToxicRequest) -> ToxicSpec:
    """Turn a decoded request into a spec, checking attribute types and values."""
    attributes = merge_attributes(request.type, {}, request.raw_attributes)
    return ToxicSpec(name=request.name, type=request.type, stream=request.stream,
                     toxicity=request.toxicity, attributes=attributes)


def decode_update(body: Any, current: ToxicSpec) -> ToxicSpec:
    """Apply an update body: given attributes are merged, an omitted toxicity is kept."""
    obj = require_object(body, "toxic")
    toxicity = to_float32(get_float(obj, "toxicity", current.toxicity))
    attributes = merge_attributes(current.type, current.attributes, get_object(obj, "attributes"))
    return dataclasses.replace(current, toxicity=toxicity, attributes=attributes)


def merge_attributes(toxic_type: str, base: dict[str, int],
                     given: dict[str, Any] | None) -> dict[str, int]:
    """All attributes of ``toxic_type``: ``given`` over ``base`` over 0. Unknown keys are ignored."""
    given = given or {}
    merged = {key: base.get(key, 0) for key in ATTRIBUTE_NAMES[toxic_type]}
    for key in merged:
        merged[key] = get_int(given, key, merged[key])
    _check_values(toxic_type, merged)
    return merged


def _check_values(toxic_type: str, attributes: dict[str, int]) -> None:
    """Reject the values that make Go's server crash or loop forever (docs/toxiproxy.md)."""
    if toxic_type == "bandwidth" and attributes["rate"] < 0:
        raise bad_body("bandwidth: rate must not be negative")
    if toxic_type == "slicer":
        average, variation = attributes["average_size"], attributes["size_variation"]
        if average < 1:
            raise bad_body("slicer: average_size must be at least 1")
        if not 0 <= variation < average:
            raise bad_body("slicer: size_variation must be in [0, average_size)")


__all__ = [
    "ATTRIBUTE_NAMES",
    "DOWNSTREAM",
    "STREAMS",
    "TOXIC_TYPES",
    "UPSTREAM",
    "ToxicRequest",
    "ToxicSpec",
    "build",
    "decode_create",
    "decode_update",
    "float32_json",
    "merge_attributes",
    "to_float32",
]
