"""The snapshot stream's frames: what a leader and a follower say on a connection that opened with
``SnapshotHello`` (``dledger.network.wire``), in the same length-prefixed CBOR envelope as Raft traffic.

    leader                                   follower
    Offer(term, meta, files: name, size)  ->
                                          <- Have(per file: bytes held, SHA-256 of them) | Refuse
    Chunk(file, offset, data, CRC32) ...  ->
    Done(per file: SHA-256 of the whole)  ->
                                          <- Staged (verified and fsynced) | Refuse

A follower that holds the start of a file from an earlier, broken transfer says so in Have, and the
leader sends only the rest when its own bytes there have the same digest: a transfer cut by a broken
link resumes. Files are compared by SHA-256, not CRC32: a file that ends with its own CRC32 (the
log's meta record does) has the same CRC32 as any other such file, so two different ones would pass
for equal; a chunk's CRC32 only guards it in transit. Pure: encoding and strict validation only (a
file name is a relative path under ``log/`` or ``app/``, never ``..``), every error a ``WireError``
naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dledger.raft.types import Membership, SnapshotMeta
from protocol.errors import WireError
from protocol.frames import decode_payload, encode_frame, encode_payload

__all__ = [
    "FILES_MAX",
    "Chunk",
    "Done",
    "Have",
    "Offer",
    "Refuse",
    "SnapshotFrame",
    "Staged",
    "decode_snapshot_frame",
    "encode_snapshot_frame",
    "valid_file_name",
]

KIND_OFFER = 16
KIND_HAVE = 17
KIND_CHUNK = 18
KIND_DONE = 19
KIND_STAGED = 20
KIND_REFUSE = 21

FILES_MAX = 1 << 16  # files in one snapshot (a 64 MiB segment each holds 4 TiB of log)
FILE_BYTES_MAX = 1 << 40
_U64_MAX = (1 << 64) - 1
_NAME = re.compile(r"(log|app)(/[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}){1,3}")


def valid_file_name(name: str) -> bool:
    """A snapshot file's name: ``log/...`` or ``app/...``, one to three plain path parts."""
    return type(name) is str and _NAME.fullmatch(name) is not None and ".." not in name


@dataclass(frozen=True, slots=True)
class Offer:
    term: int
    src: str
    dst: str
    meta: SnapshotMeta
    files: tuple[tuple[str, int], ...]  # (name, size in bytes), sent in this order


DIGEST_BYTES = 32  # SHA-256


@dataclass(frozen=True, slots=True)
class Have:
    held: tuple[tuple[int, bytes], ...]  # per offered file: (bytes held from the start, SHA-256)


@dataclass(frozen=True, slots=True)
class Chunk:
    file_no: int
    offset: int
    data: bytes
    crc32: int


@dataclass(frozen=True, slots=True)
class Done:
    digests: tuple[bytes, ...]  # per offered file: SHA-256 of all its bytes


@dataclass(frozen=True, slots=True)
class Staged:
    pass


@dataclass(frozen=True, slots=True)
class Refuse:
    reason: str


SnapshotFrame = Offer | Have | Chunk | Done | Staged | Refuse

_ENCODERS: dict[type, Callable[[Any], tuple[int, list[Any]]]] = {
    Offer: lambda f: (KIND_OFFER, [f.term, f.src, f.dst, f.meta.index, f.meta.term,
                                   f.meta.membership.encode(), [list(x) for x in f.files]]),
    Have: lambda f: (KIND_HAVE, [[list(x) for x in f.held]]),
    Chunk: lambda f: (KIND_CHUNK, [f.file_no, f.offset, f.data, f.crc32]),
    Done: lambda f: (KIND_DONE, [list(f.digests)]),
    Staged: lambda f: (KIND_STAGED, []),
    Refuse: lambda f: (KIND_REFUSE, [f.reason[:1000]]),
}


def encode_snapshot_frame(frame: SnapshotFrame) -> bytes:
    """One frame, length prefix included."""
    kind, fields = _ENCODERS[type(frame)](frame)
    return encode_frame(encode_payload(kind, fields))


def decode_snapshot_frame(payload: bytes) -> SnapshotFrame:
    """One payload of the snapshot stream, validated; WireError if malformed."""
    kind, fields = decode_payload(payload)
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise WireError(f"unknown snapshot stream kind {kind}")
    return decoder(fields)


def _u64(value: Any, what: str, limit: int = _U64_MAX) -> int:
    if type(value) is not int or not 0 <= value <= limit:
        raise WireError(f"{what} must be an integer in 0..{limit}, got {value!r:.60}")
    return value


def _text(value: Any, what: str) -> str:
    if type(value) is not str or not 0 < len(value) <= 256:
        raise WireError(f"{what} must be a string of 1..256 characters")
    return value


def _arity(fields: list[Any], n: int, what: str) -> list[Any]:
    if len(fields) != n:
        raise WireError(f"{what}: expected {n} fields, got {len(fields)}")
    return fields


def _list(value: Any, what: str, max_len: int = FILES_MAX) -> list[Any]:
    if type(value) is not list or len(value) > max_len:
        raise WireError(f"{what} must be a list of at most {max_len} items")
    return value


def _pairs(value: Any, what: str) -> list[tuple[Any, Any]]:
    items = _list(value, what)
    if any(type(x) is not list or len(x) != 2 for x in items):
        raise WireError(f"{what} must be a list of pairs")
    return [(a, b) for a, b in items]


def _offer(fields: list[Any]) -> Offer:
    term, src, dst, index, meta_term, membership, files = _arity(fields, 7, "Offer")
    names: set[str] = set()
    out = []
    for name, size in _pairs(files, "Offer.files"):
        if not valid_file_name(name) or name in names:
            raise WireError(f"Offer.files: bad or repeated file name {name!r:.80}")
        names.add(name)
        out.append((name, _u64(size, "Offer.files size", FILE_BYTES_MAX)))
    if type(membership) is not bytes:
        raise WireError("Offer.membership must be bytes")
    try:
        members = Membership.decode(membership)
    except ValueError as err:
        raise WireError(f"Offer.membership: {err}") from err
    meta = SnapshotMeta(_u64(index, "Offer.index"), _u64(meta_term, "Offer.meta_term"), members)
    return Offer(_u64(term, "Offer.term"), _text(src, "Offer.src"), _text(dst, "Offer.dst"),
                 meta, tuple(out))


def _digest(value: Any, what: str) -> bytes:
    if type(value) is not bytes or len(value) != DIGEST_BYTES:
        raise WireError(f"{what} must be a {DIGEST_BYTES}-byte SHA-256 digest")
    return value


def _have(fields: list[Any]) -> Have:
    (held,) = _arity(fields, 1, "Have")
    return Have(tuple((_u64(n, "Have bytes", FILE_BYTES_MAX), _digest(d, "Have digest"))
                      for n, d in _pairs(held, "Have.held")))


def _chunk(fields: list[Any]) -> Chunk:
    file_no, offset, data, crc = _arity(fields, 4, "Chunk")
    if type(data) is not bytes or not data:
        raise WireError("Chunk.data must be non-empty bytes")
    return Chunk(_u64(file_no, "Chunk.file_no", FILES_MAX), _u64(offset, "Chunk.offset",
                 FILE_BYTES_MAX), data, _u64(crc, "Chunk.crc32", 0xFFFFFFFF))


def _done(fields: list[Any]) -> Done:
    (digests,) = _arity(fields, 1, "Done")
    return Done(tuple(_digest(d, "Done digest") for d in _list(digests, "Done.digests")))


def _staged(fields: list[Any]) -> Staged:
    _arity(fields, 0, "Staged")
    return Staged()


def _refuse(fields: list[Any]) -> Refuse:
    (reason,) = _arity(fields, 1, "Refuse")
    if type(reason) is not str:
        raise WireError("Refuse.reason must be a string")
    return Refuse(reason[:1000])


_DECODERS: dict[int, Callable[[list[Any]], SnapshotFrame]] = {
    KIND_OFFER: _offer, KIND_HAVE: _have, KIND_CHUNK: _chunk, KIND_DONE: _done,
    KIND_STAGED: _staged, KIND_REFUSE: _refuse,
}
