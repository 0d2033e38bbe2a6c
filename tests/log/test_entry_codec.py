"""The batch encoder of the commitlog (``entry_codec.plan_chunks``) against a reference written
from the layout's docstring one entry at a time: the same bytes, the same split into segments,
for batches that fit the current segment and batches that cross into new ones."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.raft.types import Entry, EntryKind
from dledger.storage.entry_codec import HEADER_BYTES, encode_entry, encode_index_record, plan_chunks
from protocol.errors import StorageError


def reference_chunks(entries: list[Entry], position: int, fill_bytes: int | None,
                     segment_bytes_max: int, durable: int) -> list[tuple[int, bool, bytes, list[bytes]]]:
    """One entry at a time, as the layout's docstring says: (base, new segment, data, index)."""
    out: list[tuple[int, bool, bytes, list[bytes]]] = []
    for entry in entries:
        blob = encode_entry(entry, position, durable)
        if fill_bytes is None or (fill_bytes > 0 and fill_bytes + len(blob) > segment_bytes_max):
            out.append((position, True, b"", []))
            fill_bytes = 0
        elif not out:
            out.append((position - fill_bytes, False, b"", []))
        base, new, data, index = out[-1]
        out[-1] = (base, new, data + blob, [*index, encode_index_record(position, entry.term,
                                                                        len(blob))])
        fill_bytes += len(blob)
        position += len(blob)
    return out


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=40),
    first=st.integers(1, 10**6),
    term=st.integers(0, 2**40),
    position=st.integers(0, 2**40),
    fill=st.one_of(st.none(), st.integers(0, 4000)),
    segment=st.integers(HEADER_BYTES, 6000),
    durable=st.integers(0, 2**40),
    noop_at=st.integers(-1, 39),
)
def test_plan_chunks_writes_what_the_per_entry_layout_says(
    sizes: list[int], first: int, term: int, position: int, fill: int | None, segment: int,
    durable: int, noop_at: int,
) -> None:
    entries = [Entry(first + k, term + k // 7, EntryKind.NOOP if k == noop_at else EntryKind.NORMAL,
                     bytes([k % 251]) * n) for k, n in enumerate(sizes)]
    # (a segment cannot hold more than came before it)
    fill_bytes = None if fill is None else min(fill, position)
    got = [(c.base_position, c.new_segment, b"".join(c.data), c.index)
           for c in plan_chunks(entries, position, fill_bytes, segment, durable)]
    assert got == reference_chunks(entries, position, fill_bytes, segment, durable)
    for c in plan_chunks(entries, position, fill_bytes, segment, durable):
        assert len(c.records) == len(c.index)
        assert list(c.records.sizes) == [len(x) for x in _frames(b"".join(c.data))]


def _frames(data: bytes) -> list[bytes]:
    out, off = [], 0
    while off < len(data):
        size = int.from_bytes(data[off + 4: off + 8], "little")
        out.append(data[off: off + size])
        off += size
    return out


@pytest.mark.parametrize("fill", [None, 0, 100])
def test_plan_chunks_refuses_a_gap_in_the_batch(fill: int | None) -> None:
    entries = [Entry(5, 1, EntryKind.NORMAL, b"a"), Entry(7, 1, EntryKind.NORMAL, b"b")]
    with pytest.raises(StorageError, match="not contiguous: index 7 at batch offset 1"):
        plan_chunks(entries, 1000, fill, 1 << 20)


@pytest.mark.parametrize("fill", [0, 48, 500])
def test_a_segment_filled_exactly_takes_its_last_entry_and_the_next_one_starts_a_new_one(
    fill: int,
) -> None:
    entries = [Entry(1 + k, 1, EntryKind.NORMAL, b"x" * (10 * k)) for k in range(6)]
    sizes = [HEADER_BYTES + len(e.data) for e in entries]
    for cut in range(1, len(entries)):  # the segment ends exactly after entry `cut - 1`
        segment = fill + sum(sizes[:cut])
        got = [(c.base_position, c.new_segment, b"".join(c.data), c.index)
               for c in plan_chunks(entries, 10_000, fill, segment)]
        assert got == reference_chunks(entries, 10_000, fill, segment, 0)
        assert len(got[0][3]) == cut and got[1][1]  # the rest begins a new segment
