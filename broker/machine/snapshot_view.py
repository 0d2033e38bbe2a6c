"""A checkpoint's bytes without building them whole (``BrokerState.snapshot_view``).

``BrokerState.snapshot()`` is one CBOR byte string; most of a large state is the dedup table's rows
and runs (10 bytes a key and 16 a run: 10-26 MiB at the default million keys), which
``snapshot()`` copies into it. A ``SnapshotView`` is the same bytes as a list of pieces: the small
parts encoded at once (on the loop, a consistent view), and the runs and rows read in place, a
chunk at a time, as the view is iterated
(in a writer thread; the table keeps them in place while pinned). Iterating gives exactly
``snapshot()``'s bytes, so a checkpoint written either way reads the same.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator

from broker.core.dedup_format import Chunk, Range, copy_range

__all__ = ["CHUNK_BYTES", "SnapshotView", "cbor_head"]

CHUNK_BYTES = 1 << 20  # rows are read and written a MiB at a time


def cbor_head(major: int, length: int) -> bytes:
    """The head of a CBOR item of major type ``major`` (2 bytes, 4 array, 5 map) and ``length``,
    in its shortest form (as ``cbor2`` writes it)."""
    if length < 24:
        return bytes([major << 5 | length])
    for info, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if length < 1 << (8 * size):
            return bytes([major << 5 | info]) + length.to_bytes(size, "big")
    raise ValueError(f"a CBOR length of {length} does not fit")


class SnapshotView:
    """Pieces of encoded bytes, and byte ranges of a buffer nobody changes until ``release``."""

    def __init__(self, pieces: list[bytes | Range],
                 release: Callable[[], None]) -> None:
        self._pieces = pieces
        self._release = release

    def __iter__(self) -> Iterator[Chunk]:
        """The bytes, in chunks of at most CHUNK_BYTES for the ranges (iterable again)."""
        for piece in self._pieces:
            if isinstance(piece, bytes):
                yield piece
                continue
            buffer, start, end = piece
            for at in range(start, end, CHUNK_BYTES):  # (one copy of a chunk; no view kept
                yield copy_range((buffer, at, min(at + CHUNK_BYTES, end)))  # across a yield)

    def crc32(self) -> int:
        crc = 0
        for chunk in self:
            crc = zlib.crc32(chunk, crc)
        return crc

    def release(self) -> None:
        """The ranges' buffer may change again (call on the loop, once written); a second
        call does nothing."""
        release, self._release = self._release, _released
        release()


def _released() -> None:
    """A view's release once it has been released."""
