"""The state of one node (``NodeBase``): what the parts of ``dledger.node.runtime.Node`` share.

Owns the fields every part reads and writes (inbox, proposals and pending futures, the loop's
flags, the stores and the transport it was given or opened, the core) and the accessors that
name a node not started. The parts build on it: ``seams`` (what it runs on), ``proposals``
(futures), ``ready_pipeline`` (persist, send, apply), ``busy_poll`` (polling for an expected
message) and ``runtime`` (lifecycle, inputs, the loop).
Nothing here runs or does I/O; the node has one owner, its loop, so nothing is locked.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from dledger.network.seams import Transport
from dledger.node.config import Address, ApplyListener, Committed, NodeConfig
from dledger.node.oplog import NodeEventLog
from dledger.node.stats import NodeStats
from dledger.node.trace import NodeTrace
from dledger.raft.core import RaftCore
from dledger.raft.types import InstallSnapshot, Membership, Message, Ready, SnapshotMeta
from dledger.storage.flush import Flushing
from dledger.storage.seams import HardStateStore, LogStore
from protocol.errors import DiskFullError, NodeStoppedError

if TYPE_CHECKING:  # (the snapshot modules build on this one)
    from dledger.snapshots.provider import SnapshotProvider
    from dledger.snapshots.receive import SnapshotReceiver

__all__ = ["NodeBase"]


class NodeBase:
    """The fields of one member of a replicated log group (``Node`` is the whole node).

    ``log_store``, ``hard_state``, ``transport``: what the node runs on, if not its own files
    and TCP links (``dledger.node.seams``)."""

    def __init__(self, config: NodeConfig, *, applied_index: int = 0,
                 rng: random.Random | None = None, log_store: LogStore | None = None,
                 hard_state: HardStateStore | None = None,
                 transport: Transport | None = None) -> None:
        self.config = config
        self._given_log = log_store  # (None: the node opens its own, dledger.node.seams)
        self._given_hard_state = hard_state
        self._given_transport = transport
        self._applied_floor = applied_index
        self._rng = rng or random.Random()
        self._inbox: deque[Message] = deque()
        self._inbox_dropped = 0
        self._proposals: deque[tuple[bytes, asyncio.Future[Committed]]] = deque()
        self._pending: dict[tuple[int, int], asyncio.Future[Committed]] = {}
        self._listeners: list[ApplyListener] = []
        self._timer_fired = False
        self._parked = False  # the loop task waits for work: a kick may run a turn at once
        self._turning = False  # a turn runs now (no turn may start inside another)
        self._handoff: Ready | None = None  # a Ready a direct turn left to the task
        self._turn_soon = False  # a direct turn is scheduled for the proposals submitted
        self._poll_until = 0.0  # busy polling runs until then (perf_counter s); 0.0: it does not
        self._acked_entries = False  # as follower, answered an append of entries since polling
        self._acked_at = 0.0  # as follower, when it last answered an append of entries (perf s)
        self._proposed_bytes = 0  # as leader, the size of the last batch of proposals taken
        self._turn_started_at = 0.0  # when the current turn took its inputs (perf_counter s)
        self._control: deque[tuple[Callable[[], None], asyncio.Future[None]]] = deque()
        self._apply_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._stopped = False
        self._power_lost = False
        self.flusher: Flushing | None = None
        self.stats = NodeStats()  # counts for operators (metrics), cumulative since start
        self.events = NodeEventLog(config.node_id, config.slow_fsync_s)  # its INFO lines
        self.stats.fsync_logger = self.events.fsync_done
        self.last_heard_s: dict[str, float] = {}  # peer -> when a message from it last came (wall)
        self.trace: NodeTrace | None = None
        self.core: RaftCore | None = None
        self.store: LogStore | None = None
        self._hard_state: HardStateStore | None = None
        self.transport: Transport | None = None
        self.peer_address: Address | None = None
        self._leader_term: int | None = None  # term in which we lead, if we do
        self.failure: BaseException | None = None
        self._disk_full: DiskFullError | None = None  # the failed write, while riding it out
        # Snapshots (dledger.snapshots.shell): the application's, the latest the core knows,
        # transfers out (one task per follower) and in, and counters.
        self._snapshot_provider: SnapshotProvider | None = None
        self._snapshot_meta: SnapshotMeta | None = None
        self._snapshot_sends: dict[str, asyncio.Task[None]] = {}
        self._receiver: SnapshotReceiver | None = None
        self.snapshots_sent = 0
        self.snapshot_send_failures = 0
        self.snapshot_resumed_bytes = 0  # not sent again: the follower held them
        self.snapshots_installed = 0
        # Membership (dledger.membership.shell): the membership the peer links were set up for,
        # and whether the recovering marker is on disk.
        self._linked_membership: Membership | None = None
        self._retention = config.retention_policy()
        self._recovering_marker = False

    # -- provided by the other parts (declared so that each part reads on its own) -----------

    def _kick(self) -> None:
        """New work: run a turn now or wake the loop task (``runtime``)."""
        raise NotImplementedError

    def _on_flush_failure(self, err: BaseException) -> None:
        """A background group commit failed (``runtime``)."""
        raise NotImplementedError

    def _kick_soon(self) -> None:
        """New proposals: turn once the caller's callback is done (``runtime``)."""
        raise NotImplementedError

    def _note_ack(self) -> None:
        """A follower answered an append of entries (``busy_poll``)."""
        raise NotImplementedError

    async def _await(self, fut: asyncio.Future[Committed], timeout_s: float) -> Committed:
        """Wait for a proposal's future with a deadline (``proposals``)."""
        raise NotImplementedError

    def _in_loop(self, op: Callable[[], None]) -> asyncio.Future[None]:
        """Run op on the core from the loop, between Readies (``runtime``)."""
        raise NotImplementedError

    def _open_log(self) -> LogStore:
        """The log store, given or opened and recovered (``seams``)."""
        raise NotImplementedError

    def _close_log(self) -> None:
        """Close the log store if the node opened it (``seams``)."""
        raise NotImplementedError

    def _open_flusher(self, store: LogStore) -> Flushing:
        """A flusher for the store (``seams``)."""
        raise NotImplementedError

    def _initial_snapshot(self, applied_index: int) -> SnapshotMeta | None:
        """The snapshot a (re)built core starts with (``snapshot_node``)."""
        raise NotImplementedError

    def _saved_membership(self) -> tuple[int, Membership] | None:
        """The membership saved with the latest snapshot (``snapshot_node``)."""
        raise NotImplementedError

    async def _install_snapshot(self, meta: SnapshotMeta) -> None:
        """Install the snapshot a Ready hands out (``snapshot_node``)."""
        raise NotImplementedError

    def _start_snapshot_send(self, m: InstallSnapshot) -> None:
        """Stream a snapshot for the core's InstallSnapshot (``snapshot_node``)."""
        raise NotImplementedError

    # -- accessors -------------------------------------------------------------------------------

    def _core(self) -> RaftCore:
        if self.core is None:
            raise NodeStoppedError("node not started")
        return self.core

    def _flusher(self) -> Flushing:
        if self.flusher is None:
            raise NodeStoppedError("node not started")
        return self.flusher

    def _store(self) -> LogStore:
        if self.store is None:
            raise NodeStoppedError("node not started")
        return self.store
