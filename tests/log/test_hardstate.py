"""The file-backed hard-state store (``dledger.storage.hardstate.FileHardStateStore``)."""

from __future__ import annotations

import errno
import os
import struct
import zlib
from pathlib import Path

import pytest

from dledger.raft.types import HardState
from dledger.storage import hardstate
from dledger.storage.hardstate import FileHardStateStore, encode_hard_state
from protocol.errors import CorruptLogError, DiskFullError


def test_a_missing_file_loads_as_the_initial_state(tmp_path: Path) -> None:
    assert FileHardStateStore(tmp_path / "hard_state").load() == HardState()


@pytest.mark.parametrize("state", [HardState(), HardState(7, "n2"), HardState(2**40, "nœud-3")])
def test_save_then_load_round_trips(tmp_path: Path, state: HardState) -> None:
    FileHardStateStore(tmp_path / "hard_state").save(state)
    assert FileHardStateStore(tmp_path / "hard_state").load() == state


def test_save_replaces_and_a_leftover_temp_file_is_ignored(tmp_path: Path) -> None:
    store = FileHardStateStore(tmp_path / "hard_state")
    store.save(HardState(3, "n1"))
    (tmp_path / "hard_state.tmp").write_bytes(b"half-written by a crash")
    assert store.load() == HardState(3, "n1")
    store.save(HardState(4, None))
    assert store.load() == HardState(4, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hard_state"]


def valid_record_with_body(body: bytes) -> bytes:
    return struct.pack("<4sII", b"DLHS", len(body), zlib.crc32(body)) + body


@pytest.mark.parametrize(
    "damage",
    [
        lambda good: good[:-1],  # cut short
        lambda good: good[:5],  # shorter than the header
        lambda good: good[:-2] + bytes([good[-2] ^ 1]) + good[-1:],  # flipped bit in the body
        lambda good: b"XXXX" + good[4:],  # bad magic
        lambda good: b"",
        lambda good: valid_record_with_body(b"[1, 2]"),
        lambda good: valid_record_with_body(b'{"term": -1, "voted_for": null}'),
        lambda good: valid_record_with_body(b'{"term": 1, "voted_for": 5}'),
        lambda good: valid_record_with_body(b'{"term": "1"}'),
        lambda good: valid_record_with_body(b"\xff\xfe not json"),
    ],
)
def test_a_damaged_file_raises_a_named_error(tmp_path: Path, damage) -> None:
    path = tmp_path / "hard_state"
    path.write_bytes(damage(encode_hard_state(HardState(5, "n3"))))
    with pytest.raises(CorruptLogError, match="hard_state"):
        FileHardStateStore(path).load()


def test_a_full_disk_is_a_named_error_and_keeps_the_old_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileHardStateStore(tmp_path / "hard_state")
    store.save(HardState(1, "n1"))

    def no_space(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(hardstate.os, "write", no_space)
    with pytest.raises(DiskFullError):
        store.save(HardState(2, "n2"))
    monkeypatch.undo()
    assert store.load() == HardState(1, "n1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hard_state"]
    store.save(HardState(2, "n2"))
    assert store.load() == HardState(2, "n2")
