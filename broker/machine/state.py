"""The broker's state machine (``BrokerState``): the core state (``broker.core.state``) with every
feature's part, each kept under its name (``PARTS``), applying entries through the registry of
every kind (``broker.machine.kinds``). Pure and deterministic; ``snapshot``/``restore`` give the
shell a checkpoint to persist.

A checkpoint (version 8) is ``[8, applied index, core, {feature name: its state}]``: the core's
topics, queues (by number, with their store's record), offsets, dedup table and queue count, and
each feature's part under its name. A feature added later starts empty when an older checkpoint
has no state for it; a name this broker does not know is refused. Versions 1-7 (fields by
position) are read by ``broker.machine.legacy``.
"""

from __future__ import annotations

import struct
from typing import Any

import cbor2

from broker.core.consumequeue import QueueStore
from broker.core.dedup import DedupTable, Range
from broker.core.offsets import OffsetTable
from broker.core.state import CoreState, StateConfig
from broker.features.acl.model import AclTable
from broker.features.admin.model import SubscriptionGroups
from broker.features.delay.model import DelayIndex
from broker.features.orderly.model import LockTable
from broker.features.pop.model import PopTable
from broker.features.txn.model import TxnTable
from broker.machine.kinds import REGISTRY, ROUTES
from broker.machine.legacy import READ_VERSIONS, restore_legacy
from broker.machine.parts import (
    ACL,
    DELAY,
    ORDERLY,
    PARTS,
    POP,
    STATE_CANARIES,
    SUBSCRIPTION_GROUPS,
    TXN,
)
from broker.machine.snapshot_view import SnapshotView, cbor_head
from protocol.broker_errors import BadEntryError
from protocol.topics import TopicConfig

__all__ = ["CHECKPOINT_VERSION", "PARTS", "STATE_CANARIES", "BrokerState", "CheckpointAheadError",
           "StateConfig"]

CHECKPOINT_VERSION = 8  # 8: each feature's state under its name; 1-7: broker.machine.legacy


class BrokerState(CoreState):
    """The core state with every feature's part (see the module docstring)."""

    def __init__(self, config: StateConfig | None = None, applied_index: int = 0) -> None:
        super().__init__(config=config or StateConfig(), registry=REGISTRY,
                         applied_index=applied_index, topic_routes=dict(ROUTES))
        self.parts = {name: new(self.config) for name, (new, _) in PARTS.items()}
        # The pop table follows topic deletions and offsets set by commits and resets.
        self.on_topic_deleted.append(lambda topic: self.pops.forget_topic(topic))
        self.on_offset_set.append(lambda key, offset: self.pops.reset(key, offset))

    # The features' parts, typed, for the shell and the services.
    @property
    def timers(self) -> DelayIndex:
        return self.part(DELAY, DelayIndex)

    @property
    def locks(self) -> LockTable:
        return self.part(ORDERLY, LockTable)

    @property
    def txns(self) -> TxnTable:
        return self.part(TXN, TxnTable)

    @property
    def pops(self) -> PopTable:
        return self.part(POP, PopTable)

    @property
    def acl(self) -> AclTable:
        return self.part(ACL, AclTable)

    @property
    def subscription_groups(self) -> SubscriptionGroups:
        return self.part(SUBSCRIPTION_GROUPS, SubscriptionGroups)

    # -- checkpoint ------------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """Everything, in a canonical order: equal states give equal bytes."""
        return cbor2.dumps([CHECKPOINT_VERSION, self.applied_index, self._core(self.dedup.snapshot()),
                            self._features()])

    def snapshot_view(self) -> SnapshotView:
        """``snapshot()``'s bytes as pieces, the dedup table's rows read in place
        (``broker.machine.snapshot_view``): call on the loop, iterate anywhere, then ``release``."""
        core = self._core(None)
        parts = self.dedup.pin_rows()  # [first rows, words, times, rows]: pieces each
        pieces: list[bytes | Range] = [
            cbor_head(4, 4) + cbor2.dumps(CHECKPOINT_VERSION) + cbor2.dumps(self.applied_index),
            cbor_head(5, len(core))]
        for key, value in core.items():
            if key != "dedup":
                pieces.append(cbor2.dumps(key) + cbor2.dumps(value))
                continue
            head = self.dedup.snapshot_head()  # [*head, [first rows, words, times], rows]
            pieces.append(cbor2.dumps(key) + cbor_head(4, len(head) + 2)
                          + b"".join(cbor2.dumps(v) for v in head) + cbor_head(4, 3))
            for part in parts:
                size = sum(len(p) if isinstance(p, bytes) else p[2] - p[1] for p in part)
                pieces += [cbor_head(2, size), *part]
        pieces.append(cbor2.dumps(self._features()))
        return SnapshotView(pieces, self.dedup.unpin_rows)

    def _core(self, dedup: Any) -> dict[str, Any]:
        return {
            "topics": sorted([t.name, t.read_queues, t.write_queues, t.perm]
                             for t in self.topics.values()),
            "queues": sorted([t, q, units.no, self.queue_store.record(units)]
                             for (t, q), units in self.queues.items()),
            "offsets": sorted([g, t, q, o] for (g, t, q), o in self.offsets.items()),
            "dedup": dedup,
            "next_queue_no": self.next_queue_no,
        }

    def _features(self) -> dict[str, Any]:
        return {name: part.snapshot() for name, part in self.parts.items()}

    @staticmethod
    def applied_of(blob: bytes | memoryview) -> int:
        """The applied index a checkpoint holds (nothing restored; a restart reads it in
        ``restore``'s one decode, ``applied_at_most``)."""
        fields = _load(blob)
        if not (isinstance(fields, list) and len(fields) > 1 and type(fields[1]) is int):
            raise BadEntryError("malformed checkpoint")
        return fields[1]

    @classmethod
    def restore(cls, blob: bytes | memoryview, config: StateConfig | None = None,
                queue_store: QueueStore | None = None,
                applied_at_most: int | None = None) -> BrokerState:
        """The state a checkpoint holds, decoded once. ``applied_at_most``: a checkpoint applied
        past it raises ``CheckpointAheadError`` before anything (a queue file) is touched."""
        try:
            fields = _load(blob)
            version = fields[0] if isinstance(fields, list) and fields else None
            if version != CHECKPOINT_VERSION and version not in READ_VERSIONS:
                raise BadEntryError(f"unknown checkpoint version {version!r}")
            if type(fields[1]) is not int:
                raise BadEntryError("malformed checkpoint: no applied index")
            if applied_at_most is not None and fields[1] > applied_at_most:
                raise CheckpointAheadError(fields[1])
            state = cls(config, fields[1])
            if queue_store is not None:
                state.queue_store = queue_store
            if version == CHECKPOINT_VERSION:
                _restore(state, fields)
            else:
                restore_legacy(state, fields)
        except (TypeError, ValueError, KeyError, IndexError, struct.error) as err:
            raise BadEntryError(f"malformed checkpoint: {err}") from err
        return state


def _restore(state: BrokerState, fields: list[Any]) -> None:
    _, _, core, features = fields
    if not isinstance(core, dict) or not isinstance(features, dict):
        raise ValueError("a version 8 checkpoint holds the core's and the features' state")
    state.topics = {n: TopicConfig(n, r, w, p) for n, r, w, p in core["topics"]}
    store = state.queue_store
    state.queues = {(t, q): store.restore(no, record) for t, q, no, record in core["queues"]}
    next_no = core["next_queue_no"]
    if not isinstance(next_no, int):
        raise ValueError("malformed queue count")
    state.next_queue_no = next_no
    state.offsets = OffsetTable(((g, t, q), o) for g, t, q, o in core["offsets"])
    cfg = state.config
    state.dedup = DedupTable.restore(cfg.dedup_window_ms, cfg.dedup_entries_max, core["dedup"])
    unknown = sorted(set(features) - set(PARTS))
    if unknown:
        raise ValueError(f"state of features this broker does not have: {unknown}")
    for name, (_, restore) in PARTS.items():
        if name in features:
            state.parts[name] = restore(features[name], cfg)


class CheckpointAheadError(BadEntryError):
    """A checkpoint applied past the bound its reader gave (the log's end)."""

    def __init__(self, applied_index: int) -> None:
        super().__init__(f"the checkpoint is applied to {applied_index}")
        self.applied_index = applied_index


def _load(blob: bytes | memoryview) -> Any:
    try:
        return cbor2.loads(blob)
    except Exception as err:  # any decode failure is a corrupt checkpoint
        raise BadEntryError(f"corrupt checkpoint: {err}") from err
