"""The node's flusher (``dledger.storage.flush.Flusher``) against a real commitlog."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from dledger.raft.types import Entry, EntryKind
from dledger.storage import commitlog
from dledger.storage.commitlog import FileLogStore
from dledger.storage.flush import Flusher
from protocol.errors import DiskFullError


def test_a_full_disk_when_a_queued_background_commit_starts_stops_the_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The second group commit starts from the first one's done callback, which cannot raise:
    # its failure (writing the pending index records) must reach on_failure, not vanish.
    async def run() -> None:
        store = FileLogStore.open(tmp_path)
        failures: list[BaseException] = []
        flusher = Flusher(store, lambda: None, failures.append)
        store.append([Entry(1, 1, EntryKind.NORMAL, b"a")])
        flusher.sync_in_background((1, 1, 0))  # in flight
        store.append([Entry(2, 1, EntryKind.NORMAL, b"b")])
        flusher.sync_in_background((2, 1, 0))  # queued behind it
        real_pwrite = os.pwrite  # the store writes its index records with pwrite

        def full(fd: int, data: bytes, offset: int) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(commitlog.os, "pwrite", full)
        try:
            await flusher.quiesce()
        finally:
            monkeypatch.setattr(commitlog.os, "pwrite", real_pwrite)
        assert [type(e) for e in failures] == [DiskFullError]
        assert flusher.take_durable() == [(1, 1, 0)]  # the first one did complete
        await flusher.close()
        store.close()

    asyncio.run(run())
