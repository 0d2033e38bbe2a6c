"""Checkpoints of versions 1-7, which kept the state's fields by position: read into a
``BrokerState`` (``broker.machine.state``) so that old data directories still open. Versions:
7 + the ACL; 6 + pop consumption; 5 queues by number and record, fingerprint dedup; 4 +
transactions; 3 + timers, locks; 2 packed queues, columnar dedup; 1 lists. Nothing writes them
any more."""

from __future__ import annotations

import struct
from typing import Any

from broker.core.consumequeue import UNIT
from broker.core.dedup import DedupTable
from broker.core.offsets import OffsetTable
from broker.core.state import CoreState
from broker.machine.parts import ACL, DELAY, ORDERLY, PARTS, POP, TXN
from protocol.topics import TopicConfig

__all__ = ["READ_VERSIONS", "restore_legacy"]

READ_VERSIONS = (1, 2, 3, 4, 5, 6, 7)
OLD_DEDUP_ROW = struct.Struct("<IQQ")  # versions 2-4: queue id, queue offset, store time (ms)


def restore_legacy(state: CoreState, fields: list[Any]) -> None:
    """``state`` (new, with its applied index) filled from a version 1-7 checkpoint's fields."""
    version, _, topics, queues, offsets, dedup, *rest = fields
    if len(rest) != (2 if version >= 5 else 1 if version >= 3 else 0):
        raise ValueError(f"a version {version} checkpoint has {len(fields)} fields")
    state.topics = {n: TopicConfig(n, r, w, p) for n, r, w, p in topics}
    _restore_queues(state, version, queues, rest[1] if version >= 5 else None)
    state.offsets = OffsetTable(((g, t, q), o) for g, t, q, o in offsets)
    cfg = state.config
    if rest:
        timers, locks, *more = rest[0]
        if len(more) != (3 if version >= 7 else 2 if version >= 6 else 1 if version >= 4 else 0):
            raise ValueError(f"a version {version} checkpoint's feature state is short")
        for name, blob in zip((DELAY, ORDERLY, TXN, POP, ACL), (timers, locks, *more)):
            state.parts[name] = PARTS[name][1](blob, cfg)
    window, bound = cfg.dedup_window_ms, cfg.dedup_entries_max
    state.dedup = (DedupTable.restore(window, bound, dedup) if version >= 5
                   else DedupTable.from_rows(window, bound, _old_dedup_rows(version, dedup)))


def _restore_queues(state: CoreState, version: int, queues: Any, next_no: Any) -> None:
    store = state.queue_store
    if version >= 5:
        if not isinstance(next_no, int):
            raise ValueError("malformed queue count")
        state.queues = {(t, q): store.restore(no, record) for t, q, no, record in queues}
        state.next_queue_no = next_no
        return
    for no, (t, q, units) in enumerate(queues):  # earlier versions held the units themselves
        if version == 1:  # each unit a list
            packed = b"".join(UNIT.pack(*u) for u in units)
        elif isinstance(units, bytes):
            packed = units
        else:
            raise ValueError("consume queue must be packed units")
        state.queues[(t, q)] = store.from_packed(no, packed)
    state.next_queue_no = len(queues)


def _old_dedup_rows(version: int, blob: Any) -> list[tuple[str, str, int, int, int]]:
    """An earlier version's dedup table as (key, topic, queue id, offset, time) rows, oldest
    first (a key's later row wins when they are remembered again in order)."""
    if version == 1:
        return [(k, t, q, o, ts) for k, t, q, o, ts in blob]
    keys, topics, rows = blob
    if not (isinstance(keys, list) and isinstance(topics, list) and isinstance(rows, bytes)
            and len(keys) == len(topics) and len(rows) == len(keys) * OLD_DEDUP_ROW.size):
        raise ValueError("malformed dedup table")
    return [(k, t, *r) for k, t, r in zip(keys, topics, OLD_DEDUP_ROW.iter_unpack(rows))]
