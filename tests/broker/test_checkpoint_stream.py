"""A checkpoint is written without building it whole in memory (issue 34 item 3): the pieces of
``BrokerState.snapshot_view`` are ``snapshot()``'s bytes exactly, the dedup table's rows are read in
place while the table goes on, and writing a checkpoint of a large table allocates a chunk, not
copies of the table."""

from __future__ import annotations

import gc
import os
import tracemalloc
from pathlib import Path

import cbor2

from broker.core.dedup import ROW_BYTES, RUN_BYTES
from broker.machine.snapshot_view import CHUNK_BYTES, cbor_head
from broker.machine.state import BrokerState, StateConfig
from broker.shell.checkpoint import CHECKPOINT_FILE, load_checkpoint, save_checkpoint

FIXTURE = Path(__file__).resolve().parent / "data" / "checkpoint-v7.cbor"


def _every_feature() -> BrokerState:
    """The state the version 7 fixture's entries make: every feature's part holds something."""
    state = BrokerState()
    for index, position, payload in cbor2.loads(FIXTURE.read_bytes())["entries"]:
        state.apply(index, position, payload)
    return state


def _with_keys(n: int, config: StateConfig | None = None, first: int = 0) -> BrokerState:
    state = BrokerState(config)
    for k in range(first, first + n):
        state.dedup.remember(f"U{k:016d}", "growth", k % 4, k // 4, 1_700_000_000_000 + k)
    return state


def test_cbor_heads_are_those_cbor2_writes() -> None:
    for length in (0, 23, 24, 255, 256, 65535, 65536, 70000):
        assert cbor_head(2, length) + b"\0" * length == cbor2.dumps(b"\0" * length)
        assert cbor_head(4, length) + b"\0" * length == cbor2.dumps([0] * length)
    assert cbor_head(2, 2**32) == b"\x5b" + (2**32).to_bytes(8, "big")


def test_the_view_is_the_snapshots_bytes_for_every_feature_and_a_large_table() -> None:
    for state in (BrokerState(), _every_feature(), _with_keys(3 * CHUNK_BYTES // ROW_BYTES + 5)):
        view = state.snapshot_view()
        try:
            assert b"".join(view) == b"".join(view) == state.snapshot()
        finally:
            view.release()


def test_rows_stay_as_captured_while_the_table_forgets_and_compacts() -> None:
    state = _with_keys(6000, StateConfig(dedup_entries_max=6000))
    before = state.snapshot()
    view = state.snapshot_view()
    more = _with_keys(0)  # (the keys below push out the first 6000 and would compact the rows)
    for k in range(6000, 20000):
        state.dedup.remember(f"U{k:016d}", "growth", 0, k, 1_700_000_000_000 + k)
        more.dedup.remember(f"U{k:016d}", "growth", 0, k, 1_700_000_000_000 + k)
    assert len(state.dedup) == 6000
    assert b"".join(view) == before  # what was captured, although the table went on
    view.release()
    state.dedup.remember("one more", "growth", 0, 20000, 1_700_000_020_000)  # compacts now
    assert state.dedup.snapshot()[-1] != before  # (the table did move on)
    view = state.snapshot_view()
    assert b"".join(view) == state.snapshot()
    view.release()


def test_a_second_view_released_early_leaves_the_first_ones_rows_in_place() -> None:
    # a digest's view (STATE_DIGEST) taken and released while a checkpoint's view is being
    # written: the checkpoint's rows must stay as captured (the pins are counted)
    state = _with_keys(6000, StateConfig(dedup_entries_max=6000))
    before = state.snapshot()
    checkpoint = state.snapshot_view()
    digest = state.snapshot_view()
    digest.release()
    digest.release()  # (a second release does nothing)
    for k in range(6000, 20000):  # would compact the rows, were they not pinned
        state.dedup.remember(f"U{k:016d}", "growth", 0, k, 1_700_000_000_000 + k)
    assert b"".join(checkpoint) == before
    checkpoint.release()


def test_writing_a_large_checkpoint_allocates_a_chunk_not_the_table(tmp_path: Path) -> None:
    keys = 400_000
    state = _with_keys(keys)  # (each key a run of its own: 10 bytes of row and 16 of run)
    rows_bytes = keys * (ROW_BYTES + RUN_BYTES)  # 10.4 MB
    gc.collect()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        view = state.snapshot_view()
        save_checkpoint(str(tmp_path), view)
        view.release()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    extra = peak - base
    # Built whole, the snapshot held the table two or three times over (copy, CBOR, CRC prefix).
    assert extra < rows_bytes // 4, f"writing allocated {extra} bytes for {rows_bytes} of rows"
    assert os.path.getsize(tmp_path / CHECKPOINT_FILE) > rows_bytes
    loaded = load_checkpoint(str(tmp_path))
    assert loaded.snapshot() == state.snapshot()
