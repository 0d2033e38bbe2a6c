"""The dedup table's runs: where keys' messages are kept per run of keys one send stored into one
queue at one time (16 bytes a run, 10 a key), row numbers past 2**32, and checkpoints written
before the runs (24-byte rows) read into the same table on every replica."""

from __future__ import annotations

import hashlib
import struct

import cbor2

from broker.core.dedup import FP_BYTES, RUN_BYTES, DedupTable, fingerprint
from broker.machine.state import BrokerState

OLD_ROW = struct.Struct("<12sIQ")  # (the layout the previous version wrote, spelled out here)


def _old_blob(epoch: int, head: int, queues: list[list], rows: list[tuple[str, int, int, int]]
              ) -> list:
    """A dedup table as the version before the runs checkpointed it: (key, queue ref, offset,
    store time) rows, a 96-bit fingerprint each."""
    packed = b"".join(OLD_ROW.pack(hashlib.blake2b(k.encode(), digest_size=12).digest(),
                                   ts - epoch, ref << 40 | offset) for k, ref, offset, ts in rows)
    return [epoch, max((r[3] for r in rows), default=epoch), queues, head, packed]


def test_a_batch_is_one_run_and_single_sends_a_run_each() -> None:
    table = DedupTable(60_000, 1000)
    for i in range(256):  # one send's batch: one queue, one time, offsets in a row
        table.remember(f"B{i}", "t", 2, 100 + i, 5000)
    assert len(table._run_first) == 1 and len(table._rows) == 256 * FP_BYTES
    for i in range(10):  # sends one at a time: a new time each
        table.remember(f"S{i}", "t", 2, 356 + i, 5001 + i)
    assert len(table._run_first) == 11
    table.remember("X", "t", 3, 7, 5010)  # same time, another queue: a run of its own
    table.remember("Y", "t", 3, 9, 5010)  # same queue and time, not the next offset: too
    assert len(table._run_first) == 13
    assert table.get("B255") == ("t", 2, 355, 5000) and table.get("S9") == ("t", 2, 365, 5010)
    assert table.get("Y") == ("t", 3, 9, 5010)
    assert len(b"".join(table.snapshot()[4])) == 13 * RUN_BYTES


def test_rows_numbered_past_two_to_the_32_keep_their_runs() -> None:
    """A long-lived table's row numbers pass 2**32 (a run keeps its first row modulo 2**32)."""
    table = DedupTable(1000, 100)
    for i in range(5):
        table.remember(f"a{i}", "t", 0, i, 10)
    blob = table.snapshot()
    shift = (1 << 32) - 3  # the same table, its rows numbered 2**32 - 3 onwards
    firsts = [((int.from_bytes(blob[4][0][j:j + 4], "little") + shift) & 0xFFFFFFFF)
              for j in range(0, len(blob[4][0]), 4)]
    blob[3] += shift
    blob[4][0] = b"".join(f.to_bytes(4, "little") for f in firsts)
    moved = DedupTable.restore(1000, 100, blob)
    for i in range(5, 12):  # across the wrap, in runs of their own and in the run going on
        moved.remember(f"a{i}", "t", 0, i, 10 + i // 8)
    assert [moved.get(f"a{i}") for i in range(12)] == [("t", 0, i, 10 + i // 8) for i in range(12)]
    assert DedupTable.restore(1000, 100, moved.snapshot()) == moved
    moved.expire(1011)  # store time 10 is past the window: a0..a7 forgotten, a8.. kept
    assert [moved.get(f"a{i}") is None for i in range(12)] == [True] * 8 + [False] * 4


def test_a_checkpoint_from_before_the_runs_restores_the_same_table_on_every_replica() -> None:
    """Replicas restore old checkpoints taken at different points, then apply the same later
    sends: their tables are equal (same epoch, references and runs), and hold every key."""
    queues = [["t", 0], ["t", 1]]
    rows = [(f"k{i}", i % 2, i // 2, 1000 + i // 4) for i in range(40)]
    early = DedupTable.restore(60_000, 100, _old_blob(900, 7, queues, rows[:20]))
    late = DedupTable.restore(60_000, 100, _old_blob(900, 7, queues, rows))
    for key, ref, offset, ts in rows[20:]:  # the early replica replays what the late one restored
        early.remember(key, *queues[ref], offset, ts)
    assert early == late and len(late) == 40
    assert late.get("k39") == ("t", 1, 19, 1009) and late._epoch == 900
    assert late.rows()[0][0] == fingerprint("k0")  # the old 96-bit prints, cut to 80 bits


def test_a_version_8_checkpoint_with_the_old_rows_still_opens() -> None:
    state = BrokerState()
    state.dedup.remember("x", "t", 0, 0, 1000)
    fields = cbor2.loads(state.snapshot())
    fields[2]["dedup"] = _old_blob(1000, 0, [["t", 0]], [("k", 0, 5, 1200)])
    restored = BrokerState.restore(cbor2.dumps(fields))
    assert restored.dedup.get("k") == ("t", 0, 5, 1200) and restored.dedup.get("x") is None
