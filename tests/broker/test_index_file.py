"""The key index on disk (broker.features.query.index_file, broker.features.query.index): chains and
collisions, rotation by entry count named by log index, the count bound, checkpoints that survive a
reopen, damaged superblocks and files rebuilt from the log."""

from __future__ import annotations

import os
from pathlib import Path

import cbor2
import pytest

from broker.core.codec import VERSION
from broker.core.entries import KIND_TOPIC_PUT, encode_runs, encode_send
from broker.features.query.index import IndexConfig, KeyIndex, catch_up, key_hash, unique_hash
from broker.features.query.index import decoded as decoded_with
from broker.features.query.index_file import SUPER_AT, IndexFile, IndexFileError
from broker.machine.kinds import REGISTRY


def _send(topic: str, ts: int, *msgs: tuple[list[str], str]) -> object:
    return decoded_with(_payload(topic, ts, *msgs), REGISTRY)


def _payload(topic: str, ts: int, *msgs: tuple[list[str], str]) -> bytes:
    return encode_send(topic, 0, ts, [[b"b", "", list(keys), uk, [], 0] for keys, uk in msgs],
                       True, 4)


def _hits(index: KeyIndex, h: int, begin: int = 0, end: int = 2**63 - 1) -> list[tuple[int, int]]:
    return [(p, s) for p, s, _ in index.candidates(h, begin, end)]


def test_one_slot_holds_every_key_as_a_chain_newest_first(tmp_path: Path) -> None:
    f = IndexFile.create(str(tmp_path / "f.idx"), 1, slots=1, capacity=100)
    f.add([7, 0, 8, 1], 100, 1000)  # two hashes, one slot: a collision
    f.add([7, 2], 200, 2000)
    f.write_pending()
    assert list(f.chain(7, 0, 10**9, 100)) == [(200, 2, 2000), (100, 0, 1000)]
    assert list(f.chain(8, 0, 10**9, 100)) == [(100, 1, 1000)]
    assert list(f.chain(7, 1500, 10**9, 100)) == [(200, 2, 2000)]
    assert list(f.chain(7, 0, 10**9, 1)) == [(200, 2, 2000)]  # the walk's bound
    assert list(f.chain(9, 0, 10**9, 100)) == []
    f.close()


def test_a_checkpoint_survives_reopen_and_later_writes_do_not(tmp_path: Path) -> None:
    path = str(tmp_path / "f.idx")
    f = IndexFile.create(path, 5, slots=16, capacity=100)
    f.add([1, 0], 10, 1)
    f.applied_index = 5
    f.checkpoint()()
    f.add([1, 0], 20, 2)  # after the checkpoint: not durable as far as the file says
    f.applied_index = 6
    f.write_pending()
    f.close()
    g = IndexFile.open(path)
    assert (g.applied_index, g.count, g.first_index) == (5, 1, 5)
    assert list(g.chain(1, 0, 10, 10)) == [(10, 0, 1)]
    g.close()


def test_a_torn_newer_superblock_falls_back_to_the_older_one(tmp_path: Path) -> None:
    path = str(tmp_path / "f.idx")
    f = IndexFile.create(path, 1, slots=16, capacity=100)
    f.add([1, 0], 10, 1)
    f.applied_index = 1
    f.checkpoint()()  # generation 1
    f.add([2, 0], 20, 2)
    f.applied_index = 2
    f.checkpoint()()  # generation 2
    f.close()
    with open(path, "r+b") as out:
        out.seek(SUPER_AT[0] + 20)  # generation 2's superblock lives at copy 0
        out.write(b"\xff\xff")
    g = IndexFile.open(path)
    assert (g.applied_index, g.count) == (1, 1)
    g.close()
    with open(path, "r+b") as out:  # both broken: damaged, never trusted
        out.seek(SUPER_AT[1] + 20)
        out.write(b"\xff\xff")
    with pytest.raises(IndexFileError):
        IndexFile.open(path)


def test_a_damaged_entry_fails_the_checksum(tmp_path: Path) -> None:
    path = str(tmp_path / "f.idx")
    f = IndexFile.create(path, 1, slots=16, capacity=100)
    f.add([1, 0], 10, 1)
    f.checkpoint()()
    at = f._entries_at
    f.close()
    with open(path, "r+b") as out:
        out.seek(at + 5)
        out.write(b"\x01")
    with pytest.raises(IndexFileError):
        IndexFile.open(path)


def test_files_rotate_by_count_named_by_log_index_and_keep_a_bound(tmp_path: Path) -> None:
    cfg = IndexConfig(slots=8, entries_per_file=4, files_max=3)
    index = KeyIndex.open(str(tmp_path), REGISTRY, cfg)
    for i in range(1, 21):  # 20 entries of 2 keys each: 2 entries a file
        index.add(i, i * 100, _send("T", i, ([f"k{i}"], f"u{i}")))
    index.end_batch()
    names = sorted(os.listdir(tmp_path / "index"))
    assert names == [f"{i:020d}.idx" for i in (15, 17, 19)]
    assert all(f.count <= 4 for f in index.files)
    assert _hits(index, key_hash("T", "k20")) == [(2000, 0)]
    assert _hits(index, unique_hash("u15")) == [(1500, 0)]
    assert _hits(index, key_hash("T", "k3")) == []  # its file was deleted by the bound
    index.checkpoint()()
    index.checkpoint_done()
    index.close()
    again = KeyIndex.open(str(tmp_path), REGISTRY, cfg)
    assert again.applied_index == 20 and again.rebuilt_files == 0
    assert _hits(again, key_hash("T", "k19")) == [(1900, 0)]
    again.close()


def test_keys_index_topic_and_key_unique_keys_alone_and_time_ranges(tmp_path: Path) -> None:
    index = KeyIndex.open(str(tmp_path), REGISTRY, IndexConfig(slots=64, entries_per_file=100))
    index.add(1, 0, _send("A", 1000, (["k"], "u1"), (["k", "j"], "")))
    index.add(2, 50, decoded_with(encode_runs(2000, [
        ["SCHEDULE_TOPIC_XXXX", 0, [[b"x", "", ["k"], "u3", [], 0]], True, 4],
        ["B", 1, [[b"x", "", ["k"], "u2", [], 0]], True, 4]]), REGISTRY))
    index.add(3, 90, decoded_with(cbor2.dumps([VERSION, KIND_TOPIC_PUT, "C", 4, 4, 6, False]),
                                  REGISTRY))
    index.end_batch()
    assert _hits(index, key_hash("A", "k")) == [(0, 1), (0, 0)]
    assert _hits(index, key_hash("A", "j")) == [(0, 1)]
    assert _hits(index, key_hash("B", "k")) == [(50, 1)]  # slots count across the runs
    assert _hits(index, unique_hash("u2")) == [(50, 1)]
    assert _hits(index, unique_hash("u3")) == []  # a schedule-topic copy: not indexed
    assert _hits(index, key_hash("A", "k"), 1500) == []
    assert _hits(index, key_hash("B", "k"), 1500, 2500) == [(50, 1)]
    assert index.applied_index == 3
    index.close()


def test_a_damaged_file_is_deleted_with_later_ones_and_rebuilt_from_the_log(tmp_path: Path) -> None:
    from dledger.raft.types import Entry, EntryKind
    from dledger.storage.commitlog import FileLogStore

    log_dir = tmp_path / "log"
    store = FileLogStore.open(str(log_dir))
    store.append([Entry(i, 1, EntryKind.NORMAL, _payload("T", i, ([f"k{i}"], "")))
                  for i in range(1, 11)])
    store.sync()
    positions = {i: store.position_of(i) for i in range(1, 11)}
    store.close()
    cfg = IndexConfig(slots=8, entries_per_file=3, files_max=0)
    index = KeyIndex.open(str(tmp_path), REGISTRY, cfg)
    assert catch_up(index, str(log_dir), 10) == 10
    index.checkpoint()()
    index.checkpoint_done()
    names = sorted(os.listdir(tmp_path / "index"))
    index.close()
    assert len(names) == 4
    with open(tmp_path / "index" / names[1], "r+b") as f:  # both superblocks of the 2nd file
        for at in SUPER_AT:
            f.seek(at)
            f.write(b"junk")
    again = KeyIndex.open(str(tmp_path), REGISTRY, cfg)
    assert again.rebuilt_files == 3 and again.applied_index == 3
    assert catch_up(again, str(log_dir), 10) == 7
    assert sorted(os.listdir(tmp_path / "index")) == names  # the same files again
    for i in range(1, 11):
        assert _hits(again, key_hash("T", f"k{i}")) == [(positions[i], 0)]
    again.close()
