"""A node's configuration and the values its API hands out: ``NodeConfig`` (checked when made,
and turned into the Raft core's ``RaftConfig``), ``Committed`` (where a proposal landed),
``AppliedEntry`` (what apply listeners and reads of committed entries get) and ``NodeStatus``.

Plain frozen values: no I/O, nothing that runs. The node that uses them is ``dledger.node.runtime``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from dledger.raft.config import Canaries, RaftConfig
from dledger.raft.types import EntryKind, Status
from dledger.storage.retention import RetentionPolicy
from protocol.tls import TlsConfig

__all__ = [
    "MAX_BUSY_POLL_US",
    "Address",
    "AppliedEntry",
    "ApplyListener",
    "Committed",
    "FlushMode",
    "NodeConfig",
    "NodeStatus",
]

MAX_BUSY_POLL_US = 10_000

FlushMode = Literal["sync", "async"]
Address = tuple[str, int]


@dataclass(frozen=True)
class NodeConfig:
    group: str
    node_id: str
    peers: dict[str, Address]  # every member, this node included: node id -> peer listen address
    data_dir: str
    dial: dict[str, Address] = field(default_factory=dict)  # where to dial a peer, if not peers[p]
    listen: Address | None = None  # peer listen address; default peers[node_id]
    flush_mode: FlushMode = "sync"
    async_flush_interval_s: float = 0.05
    tick_interval_s: float = 0.1
    election_ticks: int = 10  # election timeout 1-2 s at 100 ms ticks
    heartbeat_ticks: int = 1
    preferred_leader: str | None = None
    max_pending_proposals: int = 20_000
    inbox_max: int = 20_000
    step_batch_max: int = 2_000
    propose_batch_max: int = 512
    segment_bytes_max: int = 64 << 20
    retention_entries: int | None = None  # keep at least this many entries; None: keep all
    # With snapshots (an application that gives the node a SnapshotProvider): retention keeps
    # what a lagging member still needs only while it is within this many entries of the log's
    # end; a member further behind is sent a snapshot instead.
    retention_lag_entries: int = 1_000_000
    # RocketMQ's rules (dledger.storage.retention), with snapshots only; off here, RocketMQ's defaults
    # on the command line (72 h, at 04, 75% and 85% of the disk).
    file_reserved_hours: float | None = None
    delete_hours: tuple[int, ...] = (4,)
    disk_max_used_ratio: float = 1.0
    disk_forcibly_ratio: float = 1.0
    snapshot_timeout_s: float = 10.0  # each wait of a snapshot transfer (connect, chunk, answer)
    # A node that expects a message soon polls its sockets instead of sleeping, for up to this
    # long after its last turn: a leader with proposals awaiting commit, a follower that just
    # acknowledged entries (the next append usually follows). A message is then read as it
    # lands, not after the CPU wakes from idle. Any node also polls this long for its inline
    # group commits to end (dledger.storage.aiofsync), rather than sleeping in fdatasync. Costs that
    # much CPU per idle gap; 0 (default) sleeps at once.
    busy_poll_us: int = 0
    quorum_first: bool = False  # see RaftConfig.quorum_first
    # Run the fsyncs that the loop does not do inline through Linux AIO, where available
    # (dledger.storage.aiofsync), rather than on a thread: no thread hand-off per group commit.
    aio_fsync: bool = True
    canaries: Canaries = field(default_factory=Canaries)
    # A node joining a running group (a new member, or one whose disk was replaced): it has no
    # membership until the leader's log or snapshot brings one, so it neither campaigns nor
    # votes before (dledger.raft.membership).
    join: bool = False
    test_faults: bool = False  # allow power_loss() and canaries (tests only)
    # Tests only: the process exits at this step of its first snapshot install ("staged": the
    # snapshot staged, not installed; "commit": the install committed, not finished).
    test_crash_in_install: str | None = None
    trace_path: str | None = None  # append an event trace (JSON lines) here: tests, chaos runs
    # TLS on the peer listener and peer dials (and, in a server process, its client and HTTP
    # listeners): protocol.tls. None: plain TCP.
    tls: TlsConfig | None = None
    # A node whose disk is full waits without taking part (dledger.node.disk_full), looking at the
    # free space this often, and rebuilds from disk once there is this much.
    disk_probe_interval_s: float = 1.0
    disk_resume_free_bytes: int = 8 << 20
    slow_fsync_s: float = 0.5  # an fsync slower than this is logged (dledger.node.oplog)

    def __post_init__(self) -> None:
        if self.node_id not in self.peers:
            raise ValueError(f"node {self.node_id!r} is not in peers {sorted(self.peers)}")
        if self.flush_mode not in ("sync", "async"):
            raise ValueError(f"flush mode must be 'sync' or 'async', not {self.flush_mode!r}")
        if (self.canaries.any() or self.test_crash_in_install) and not self.test_faults:
            raise ValueError("canaries and test crashes need test_faults=True")
        if self.test_crash_in_install not in (None, "staged", "commit"):
            raise ValueError(f"unknown install crash point {self.test_crash_in_install!r}")
        if self.retention_lag_entries < 0 or self.snapshot_timeout_s <= 0:
            raise ValueError("retention_lag_entries must be >= 0 and snapshot_timeout_s > 0")
        if self.slow_fsync_s < 0:
            raise ValueError(f"slow_fsync_s must be >= 0, not {self.slow_fsync_s}")
        self.retention_policy()  # (checks its values)
        if not 0 <= self.busy_poll_us <= MAX_BUSY_POLL_US:
            raise ValueError(f"busy_poll_us must be within 0..{MAX_BUSY_POLL_US}, "
                             f"not {self.busy_poll_us}")

    def retention_policy(self) -> RetentionPolicy:
        return RetentionPolicy(self.retention_entries, self.file_reserved_hours,
                               self.delete_hours, self.disk_max_used_ratio,
                               self.disk_forcibly_ratio)

    def raft_config(self) -> RaftConfig:
        return RaftConfig(node_id=self.node_id, voters=tuple(sorted(self.peers)),
                          election_ticks=self.election_ticks, heartbeat_ticks=self.heartbeat_ticks,
                          preferred_leader=self.preferred_leader, canaries=self.canaries,
                          quorum_first=self.quorum_first,
                          check_quorum=not self.canaries.no_pre_vote_check_quorum,
                          pre_vote=not self.canaries.no_pre_vote_check_quorum, join=self.join)


@dataclass(frozen=True, slots=True)
class Committed:
    """Where a committed proposal landed."""

    index: int
    term: int
    position: int  # byte position in the commitlog, the same on every replica


@dataclass(frozen=True, slots=True)
class AppliedEntry:
    index: int
    term: int
    kind: EntryKind
    data: bytes
    position: int


@dataclass(frozen=True)
class NodeStatus:
    group: str
    raft: Status
    flush_mode: FlushMode
    peer_address: Address | None
    pending_proposals: int
    inbox_dropped: int
    transport: dict[str, dict[str, int]]
    storage_first_index: int
    storage_last_index: int
    disk_full: bool = False  # a write failed for want of space: not taking part (dledger.node.disk_full)
    disk_full_error: str | None = None
    snapshot: dict[str, int | list[str]] = field(default_factory=dict)  # dledger.snapshots.shell
    membership: dict[str, object] = field(default_factory=dict)  # dledger.membership.shell
    # peer -> when this node last heard from it (wall-clock seconds), whatever its role: a
    # new leader knows when it last heard from a member that died before it took over
    last_heard_s: dict[str, float] = field(default_factory=dict)


ApplyListener = Callable[[Sequence[AppliedEntry]], None]
