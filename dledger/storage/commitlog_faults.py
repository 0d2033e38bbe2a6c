"""Test-only faults of the commitlog: ``power_loss`` makes a log directory look as a power loss
would leave it (unsynced bytes gone, or torn a sector at a time), then closes the store.

Owns what may survive of bytes written since the last fsync, as recovery must expect it (see
``dledger.storage.commitlog``). Used by the tests and, through the node's test-only ``power_loss``
(behind ``test_faults``), the live chaos suite's power-loss fault; never on a production path.
"""

from __future__ import annotations

import os
import random

from dledger.storage.commitlog_reads import LogReads
from dledger.storage.entry_codec import INDEX_RECORD_BYTES
from dledger.storage.segment import SECTOR_BYTES, ZEROS, Segment, pwrite_all

__all__ = ["PowerLossFaults"]


class PowerLossFaults(LogReads):
    """``FileLogStore.power_loss`` and its helpers."""

    def power_loss(self, rng: random.Random | None = None, tear: bool = False) -> int:
        """Test only: make the files look as after a power loss, then close the store.

        Discards every byte written since the last ``sync()`` (files created since are removed).
        With ``tear``, sealed segments keep what their seal made durable, and the last segment
        keeps some of its unsynced bytes: either a random prefix (tearing the last write, maybe
        mid-entry) or, as pages reach a disk in any order, each unsynced sector or none of it,
        independently, in a file still holding its zero-filled tail. Its index keeps a random
        prefix of its unsynced records. Returns the number of data bytes discarded.
        """
        self._check_usable()
        rng = rng if rng is not None else random.Random(0)
        discarded_bytes = 0
        for seg in list(self._segments):
            last = seg is self._segments[-1]
            if tear and last and rng.random() < 0.5:
                discarded_bytes += self._scramble_unsynced(seg, rng)
                data_bytes = None
                index_bytes = rng.randint(seg.durable_entry_count, seg.entry_count)
                index_bytes *= INDEX_RECORD_BYTES
            elif tear:
                data_bytes, index_bytes = self._torn_sizes(seg, last, rng)
            elif seg.created_since_sync:
                discarded_bytes += seg.data_bytes
                self._delete_segment(seg)
                self._segments.remove(seg)
                continue
            else:
                data_bytes = seg.synced_data_bytes
                index_bytes = seg.synced_entry_count * INDEX_RECORD_BYTES
            # Records still pending were never written: they cannot survive.
            index_bytes = min(index_bytes, seg.index_records_in_file * INDEX_RECORD_BYTES)
            seg.pending_index.clear()
            if data_bytes is not None:
                discarded_bytes += seg.data_bytes - data_bytes
                os.ftruncate(seg.data_fd, data_bytes)
            os.ftruncate(seg.index_fd, index_bytes)
        self._release(tidy=False)
        return discarded_bytes

    @staticmethod
    def _scramble_unsynced(seg: Segment, rng: random.Random) -> int:
        """Zero each sector of the unsynced data (from the last fsync on) with probability 1/2;
        returns the bytes zeroed."""
        zeroed_bytes = 0
        offset = seg.durable_data_bytes
        while offset < seg.data_bytes:
            end = min((offset // SECTOR_BYTES + 1) * SECTOR_BYTES, seg.data_bytes)
            if rng.random() < 0.5:
                pwrite_all(seg.data_fd, ZEROS[: end - offset], offset)
                zeroed_bytes += end - offset
            offset = end
        return zeroed_bytes

    @staticmethod
    def _torn_sizes(seg: Segment, last: bool, rng: random.Random) -> tuple[int, int]:
        if not last:
            return seg.durable_data_bytes, seg.durable_entry_count * INDEX_RECORD_BYTES
        data_lo, data_hi = seg.durable_data_bytes, seg.data_bytes
        index_lo = seg.durable_entry_count * INDEX_RECORD_BYTES
        index_hi = seg.entry_count * INDEX_RECORD_BYTES
        return rng.randint(data_lo, data_hi), rng.randint(index_lo, index_hi)
