"""The node runtime: one asyncio task owns a Raft core and drives it
(tick -> step -> ready -> persist -> send -> apply -> advance), around the file stores and the
peer transport. This is the imperative shell of DESIGN.md section 2.

Owns pending proposals (futures keyed by (term, index), resolved when that entry is applied with
the same term, failed when leadership changes), the bounded inbox, flush modes (``sync``: one
fsync per Ready before anything that depends on it leaves; ``async``: page cache, flushed
periodically), retention, apply listeners and the node's status. It must not interpret entry
bodies: that is the state machine's business (the broker).

While the loop task is parked with nothing to do, a message or proposal that arrives is handled
at once, in the callback that brought it (``_turn_now``), rather than by waking the task: on the
one-at-a-time latency path that saves a task switch on every hop. Such a turn never awaits; a
Ready that must wait for the disk is handed to the task.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

from dledger.commitlog import FileLogStore
from dledger.flush import Flusher
from dledger.errors import (
    DLedgerError,
    LeadershipLostError,
    NodeStoppedError,
    NotLeaderError,
    OverloadedError,
    ProposalError,
    ProposalTimeoutError,
)
from dledger.hardstate import FileHardStateStore
from dledger.raft.config import Canaries, RaftConfig
from dledger.raft.core import RaftCore
from dledger.raft.types import Entry, EntryKind, Message, Ready, Role, Status
from dledger.aiofsync import open_aio_fsync, open_spin_sync
from dledger.trace import NodeTrace
from dledger.transport import PeerTransport

log = logging.getLogger("dledger.runtime")

RETAIN_INTERVAL_S = 1.0
TIMER_SLACK_S = 0.001  # event loops may wake a timer up to a millisecond early

# How the fsync of one Ready's writes happens (Node._sync_plan).
_NO_SYNC = 0  # nothing to fsync, or the async flush mode
_DEFER = 1  # the leader's background group commit; its copy counts once mark_durable says so
_INLINE = 2  # on the loop thread with a plain fdatasync, before the Ready's messages leave
_AWAIT = 3  # awaited (AIO or the fsync thread) while the loop runs, before the messages leave
_SPIN = 4  # on the loop thread, spin-waited (see Flusher.sync_inline), before the messages leave

MAX_BUSY_POLL_US = 10_000
# A leader polls for acknowledgements only while at most this many proposals await commit (a
# lone proposer's, or a short burst): a bigger batch's round trip is long (the followers decode,
# write and fsync all of it), and on a box with fewer cores than replicas polling through it only
# takes CPU from the followers doing that work.
BUSY_POLL_PENDING_MAX = 4

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
    # A node that expects a message soon polls its sockets instead of sleeping, for up to this
    # long after its last turn: a leader with proposals awaiting commit, a follower that just
    # acknowledged entries (the next append usually follows). A message is then read as it
    # lands, not after the CPU wakes from idle. Any node also polls this long for its inline
    # group commits to end (dledger.aiofsync), rather than sleeping in fdatasync. Costs that
    # much CPU per idle gap; 0 (default) sleeps at once.
    busy_poll_us: int = 0
    quorum_first: bool = False  # see RaftConfig.quorum_first
    # Run the fsyncs that the loop does not do inline through Linux AIO, where available
    # (dledger.aiofsync), rather than on a thread: no thread hand-off per group commit.
    aio_fsync: bool = True
    canaries: Canaries = field(default_factory=Canaries)
    test_faults: bool = False  # allow power_loss() and canaries (tests only)
    trace_path: str | None = None  # append an event trace (JSON lines) here: tests, chaos runs

    def __post_init__(self) -> None:
        if self.node_id not in self.peers:
            raise ValueError(f"node {self.node_id!r} is not in peers {sorted(self.peers)}")
        if self.flush_mode not in ("sync", "async"):
            raise ValueError(f"flush mode must be 'sync' or 'async', not {self.flush_mode!r}")
        if self.canaries.any() and not self.test_faults:
            raise ValueError("canaries need test_faults=True")
        if not 0 <= self.busy_poll_us <= MAX_BUSY_POLL_US:
            raise ValueError(f"busy_poll_us must be within 0..{MAX_BUSY_POLL_US}, "
                             f"not {self.busy_poll_us}")

    def raft_config(self) -> RaftConfig:
        return RaftConfig(node_id=self.node_id, voters=tuple(sorted(self.peers)),
                          election_ticks=self.election_ticks, heartbeat_ticks=self.heartbeat_ticks,
                          preferred_leader=self.preferred_leader, canaries=self.canaries,
                          quorum_first=self.quorum_first,
                          check_quorum=not self.canaries.no_pre_vote_check_quorum,
                          pre_vote=not self.canaries.no_pre_vote_check_quorum)


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


ApplyListener = Callable[[Sequence[AppliedEntry]], None]


class Node:
    """One member of a replicated log group."""

    def __init__(self, config: NodeConfig, *, applied_index: int = 0,
                 rng: random.Random | None = None) -> None:
        self.config = config
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
        self._turn_started_at = 0.0  # when the current turn took its inputs (perf_counter s)
        self._control: deque[tuple[Callable[[], None], asyncio.Future[None]]] = deque()
        self._apply_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._stopped = False
        self._power_lost = False
        self.flusher: Flusher | None = None
        self.trace: NodeTrace | None = None
        self.core: RaftCore | None = None
        self.store: FileLogStore | None = None
        self._hard_state: FileHardStateStore | None = None
        self.transport: PeerTransport | None = None
        self.peer_address: Address | None = None
        self._leader_term: int | None = None  # term in which we lead, if we do
        self.failure: BaseException | None = None

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> Address:
        """Open storage, recover, start the transport and the loop; returns the peer address."""
        cfg = self.config
        os.makedirs(cfg.data_dir, exist_ok=True)
        self.store = FileLogStore.open(os.path.join(cfg.data_dir, "log"),
                                       segment_bytes_max=cfg.segment_bytes_max,
                                       verify_checksums=not cfg.canaries.skip_checksum)
        self._hard_state = FileHardStateStore(os.path.join(cfg.data_dir, "hardstate"))
        if cfg.trace_path is not None:
            self.trace = NodeTrace(cfg.trace_path, cfg.node_id)
        self.core = RaftCore(cfg.raft_config(), self.store, self._hard_state.load(),
                             random.Random(self._rng.random()), applied_index=self._applied_floor)
        dial = {p: cfg.dial.get(p, addr) for p, addr in cfg.peers.items() if p != cfg.node_id}
        self.transport = PeerTransport(cfg.node_id, cfg.group, cfg.listen or cfg.peers[cfg.node_id],
                                       dial, self._on_message, rng=random.Random(self._rng.random()),
                                       on_batch_end=self._kick)
        self.peer_address = await self.transport.start()  # (nothing turns before the task runs)
        spin = open_spin_sync(cfg.busy_poll_us / 1e6) if cfg.busy_poll_us else None
        aio = open_aio_fsync() if cfg.aio_fsync else None
        self.flusher = Flusher(self.store, self._kick, self._on_flush_failure, spin, aio)
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"dledger-node-{cfg.node_id}")
        return self.peer_address

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        if self.flusher is not None:
            await self.flusher.close()
        if self.transport is not None:
            await self.transport.stop()
        self._fail_all(NodeStoppedError("node stopped"))
        if self.store is not None and not self._power_lost:
            if self.config.flush_mode == "async" and self.failure is None:
                self.store.sync()
            self.store.close()
        if self.trace is not None:
            self.trace.close()
        self._stopped = True

    async def join(self) -> None:
        """Wait until the node's loop ends (stop() or a fatal error). Cancelling the caller
        does not cancel the loop."""
        if self._task is not None:
            await asyncio.wait({self._task})

    async def power_loss(self, tear: bool = False) -> int:
        """Test-only: stop the loop (between Readies), then discard every log byte written since
        the last fsync. The caller kills the process right after. Returns the bytes discarded."""
        if not self.config.test_faults:
            raise PermissionError("power_loss needs test_faults=True")
        self._stopping = True
        self._kick()
        await self.join()
        await self._flusher().quiesce()
        self._power_lost = True
        return self._store().power_loss(self._rng, tear=tear)

    # -- public API ----------------------------------------------------------------------------

    async def propose(self, data: bytes, timeout_s: float = 3.0) -> Committed:
        """Replicate data; returns once it is committed and applied here.

        Raises NotLeaderError (with a leader hint), OverloadedError, LeadershipLostError or
        ProposalTimeoutError (outcome unknown), NodeStoppedError."""
        return await self._await(self.submit(data), timeout_s)

    async def propose_batch(self, items: Sequence[bytes], timeout_s: float = 3.0) -> list[Committed]:
        futs = [self.submit(d) for d in items]
        return [await self._await(f, timeout_s) for f in futs]

    def add_apply_listener(self, listener: ApplyListener) -> None:
        """Call listener with every batch of applied entries, in log order, from the loop."""
        self._listeners.append(listener)

    async def wait_applied(self, index: int, timeout_s: float) -> None:
        core = self._core()
        if core.log.applied_index >= index:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._apply_waiters.append((index, fut))
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError as err:
            self._apply_waiters = [w for w in self._apply_waiters if w[1] is not fut]
            raise ProposalTimeoutError(f"index {index} not applied within {timeout_s} s") from err

    async def read_barrier(self, timeout_s: float = 3.0) -> None:
        """Return once this node leads and has applied everything committed before its term
        (its no-op), so reads of applied state see every earlier commit (Raft section 8).
        Raises NotLeaderError or ProposalTimeoutError."""
        core = self._core()
        if core.role is not Role.LEADER:
            raise NotLeaderError(core.leader_id, core.term)
        await self.wait_applied(core.term_start_index, timeout_s)

    def read_committed(self, lo: int, max_entries: int = 256,
                       max_bytes: int = 4 << 20) -> list[AppliedEntry]:
        """Committed entries from index lo, as stored here (followers serve these too)."""
        core, store = self._core(), self._store()
        hi = min(core.log.commit_index, store.last_index(), lo + max_entries - 1)
        if lo > hi:
            return []
        return [AppliedEntry(e.index, e.term, e.kind, e.data, store.position_of(e.index))
                for e in store.entries(max(lo, store.first_index()), hi + 1, max_bytes)]

    def status(self) -> NodeStatus:
        store = self._store()
        return NodeStatus(
            group=self.config.group, raft=self._core().status(), flush_mode=self.config.flush_mode,
            peer_address=self.peer_address, pending_proposals=len(self._pending) + len(self._proposals),
            inbox_dropped=self._inbox_dropped,
            transport=self.transport.stats() if self.transport else {},
            storage_first_index=store.first_index(), storage_last_index=store.last_index())

    @property
    def is_leader(self) -> bool:
        return self.core is not None and self.core.role is Role.LEADER

    async def transfer_leadership(self, to: str, timeout_s: float = 5.0) -> None:
        """Hand leadership to node ``to`` and wait until it leads (or raise on timeout)."""
        await self._in_loop(lambda: self._core().transfer_leadership(to))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._core().leader_id == to:
                return
            await asyncio.sleep(self.config.tick_interval_s / 2)
        raise ProposalTimeoutError(f"leadership did not move to {to} within {timeout_s} s")

    # -- inputs from the transport and callers ------------------------------------------------

    def _on_message(self, m: Message) -> None:
        """From the transport, which calls ``_kick`` once the messages of a read are in."""
        if len(self._inbox) >= self.config.inbox_max:
            self._inbox_dropped += 1  # Raft tolerates loss; the sender will retry
            return
        self._inbox.append(m)

    def submit(self, data: bytes) -> asyncio.Future[Committed]:
        """Queue a proposal; the future ends committed, or with a named error (leadership lost,
        node stopped). It has no deadline of its own: ``propose`` adds one."""
        if self._stopping or self._task is None:
            raise NodeStoppedError("node is not running")
        core = self._core()
        if core.role is not Role.LEADER:
            raise NotLeaderError(core.leader_id, core.term)
        if len(self._pending) + len(self._proposals) >= self.config.max_pending_proposals:
            raise OverloadedError(f"{self.config.max_pending_proposals} proposals pending")
        fut: asyncio.Future[Committed] = asyncio.get_running_loop().create_future()
        self._proposals.append((data, fut))
        self._kick_soon()
        return fut

    async def _await(self, fut: asyncio.Future[Committed], timeout_s: float) -> Committed:
        # A timer on the proposal's own future rather than wait_for(shield(...)): one loop turn
        # from commit to caller instead of three, on the latency path of every proposal. The
        # future is this caller's alone. Cancelling the wait cancels it: a proposal still queued
        # is then dropped before it reaches the log, and one already in the log may commit
        # (the loop skips a future that is done).
        timer = asyncio.get_running_loop().call_later(timeout_s, _expire, fut, timeout_s)
        try:
            return await fut
        finally:
            timer.cancel()

    def _in_loop(self, op: Callable[[], None]) -> asyncio.Future[None]:
        """Run op on the core from the loop, between Readies (the core has one owner)."""
        if self._stopping or self._task is None:
            raise NodeStoppedError("node is not running")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._control.append((op, fut))
        self._kick()
        return fut

    def _run_control(self) -> None:
        while self._control:
            op, fut = self._control.popleft()
            try:
                op()
            except (DLedgerError, ValueError) as err:
                if not fut.done():
                    fut.set_exception(err)
                continue
            if not fut.done():
                fut.set_result(None)

    def _kick_soon(self) -> None:
        """New proposals: handled by one turn once the caller's callback is done, so that the
        proposals submitted together (a burst from one request, propose_batch) form one batch."""
        if self._can_turn_now():
            if not self._turn_soon:
                self._turn_soon = True
                asyncio.get_running_loop().call_soon(self._scheduled_turn)
        elif self._wake is not None:
            self._wake.set()

    def _can_turn_now(self) -> bool:
        """The loop task is parked, between Readies, and no turn runs: a callback may run one."""
        return self._parked and not self._turning and not self._stopping and self._handoff is None

    def _scheduled_turn(self) -> None:
        self._turn_soon = False
        self._kick()

    def _on_timer(self) -> None:
        self._timer_fired = True  # ticks and periodic work belong to the loop task
        if self._wake is not None:
            self._wake.set()

    def _kick(self) -> None:
        """New work (a message, a proposal, a control op, a finished fsync)."""
        if self._can_turn_now():
            self._turn_now()
        elif self._wake is not None:
            self._wake.set()

    # -- the loop ------------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        tick_s = self.config.tick_interval_s
        next_tick = loop.time() + tick_s
        next_flush = loop.time() + self.config.async_flush_interval_s
        next_retain = loop.time() + RETAIN_INTERVAL_S
        timer, timer_at = loop.call_at(next_tick, self._on_timer), next_tick
        try:
            while not self._stopping:
                if not self._inbox and not self._proposals and self._handoff is None:
                    if self.config.busy_poll_us and self._expects_message():
                        self._busy_poll()
                    self._parked = True
                    try:
                        await self._wake.wait()  # type: ignore[union-attr]
                    finally:
                        self._parked = False
                    if self._stopping:
                        break
                self._wake.clear()  # type: ignore[union-attr]
                if self._handoff is not None:
                    rd, self._handoff = self._handoff, None
                    self._advance(rd, await self._handle_ready(rd))
                now = loop.time()
                if now >= next_tick - TIMER_SLACK_S:
                    next_tick = self._tick_until(now + TIMER_SLACK_S, next_tick, tick_s)
                flush_due = self.config.flush_mode == "async" and now >= next_flush - TIMER_SLACK_S
                if flush_due:
                    next_flush = now + self.config.async_flush_interval_s
                wake_at = next_tick
                if self.config.flush_mode == "async":
                    wake_at = min(wake_at, next_flush)  # direct turns do not flush: wake for it
                if self._timer_fired or timer_at != wake_at:
                    # (a loop may fire a timer a little early: always keep one armed)
                    timer.cancel()
                    self._timer_fired = False
                    timer, timer_at = loop.call_at(wake_at, self._on_timer), wake_at
                self._take_inputs()
                await self._drain_ready()
                if flush_due:
                    self._flusher().sync_in_background()  # the loop does not wait for the disk
                if now >= next_retain:
                    await self._maybe_retain()
                    next_retain = now + RETAIN_INTERVAL_S
                if self._inbox or self._proposals:
                    await asyncio.sleep(0)  # let the transport read before the next batch
        except asyncio.CancelledError:
            self._fail_all(NodeStoppedError("node loop cancelled"))
            raise
        except BaseException as err:
            self._fail(err)
            raise
        finally:
            timer.cancel()

    def _take_inputs(self) -> None:
        """Hand the core what came in since the last turn: finished fsyncs, control ops,
        messages, proposals (a turn of the task or a direct one)."""
        if self.config.busy_poll_us:  # (only a polling follower looks at it: see _note_ack)
            self._turn_started_at = time.perf_counter()
        core = self._core()
        for target in self._flusher().take_durable():
            core.mark_durable(*target)
        self._run_control()
        self._step_inbox()
        self._take_proposals()

    def _tick_until(self, now: float, next_tick: float, tick_s: float) -> float:
        core = self._core()
        ticks = 0
        while now >= next_tick and ticks < 5:
            core.tick()
            next_tick += tick_s
            ticks += 1
        if now >= next_tick:  # the loop stalled: do not replay a burst of ticks
            next_tick = now + tick_s
        return next_tick

    def _step_inbox(self) -> None:
        core = self._core()
        for _ in range(min(len(self._inbox), self.config.step_batch_max)):
            core.step(self._inbox.popleft())

    def _take_proposals(self) -> None:
        if not self._proposals:
            return
        core = self._core()
        batch: list[tuple[bytes, asyncio.Future[Committed]]] = []
        while self._proposals and len(batch) < self.config.propose_batch_max:
            data, fut = self._proposals.popleft()
            if not fut.done():
                batch.append((data, fut))
        if not batch:
            return
        try:
            placed = core.propose_batch([d for d, _ in batch])
        except ProposalError as err:
            for _, fut in batch:
                fut.set_exception(_clone_error(err))
            return
        for (term, index), (_, fut) in zip(placed, batch):
            self._pending[(term, index)] = fut
        self._leader_term = core.term

    async def _drain_ready(self) -> None:
        core = self._core()
        for _ in range(10_000):
            if not core.has_ready():
                break
            rd = core.ready()
            self._advance(rd, await self._handle_ready(rd))
        self._check_leadership()

    def _turn_now(self) -> None:
        """One turn of the loop, run in the callback that brought new work while the loop task
        is parked (ticks and periodic work stay with the task). Never awaits: a Ready that must
        wait for the disk is handed to the task. An error stops the node, as in the task."""
        self._turning = True
        try:
            core, flusher = self._core(), self._flusher()
            self._take_inputs()
            for _ in range(10_000):
                if not core.has_ready():
                    break
                rd = core.ready()
                plan = self._sync_plan(rd)
                if plan == _AWAIT or (flusher.busy and self._truncates(rd)):
                    self._handoff = rd
                    break
                self._advance(rd, self._do_ready(rd, plan))
            self._check_leadership()
        except Exception as err:  # recorded, logged and stops the node, as in the loop task
            self._fail(err)
        finally:
            self._turning = False
        if self._handoff is not None or self._inbox or self._proposals:
            self._wake.set()  # type: ignore[union-attr]
        elif self.config.busy_poll_us and self._expects_message():
            self._busy_poll()

    def _note_ack(self) -> None:
        """A follower answered an append of entries. It polls for the next one only if the last
        one came within the polling window of the answer before it: a lone proposer's next
        entry does, one round trip later; under load the leader takes longer to gather the next
        batch, and polling would only take CPU from it (and from the other processes)."""
        now = time.perf_counter()
        idle_s, self._acked_at = self._turn_started_at - self._acked_at, now
        self._acked_entries = idle_s * 1e6 <= self.config.busy_poll_us

    def _expects_message(self) -> bool:
        """A message is due soon: as leader, an acknowledgement of a few proposals awaiting
        commit (see BUSY_POLL_PENDING_MAX); as follower that just acknowledged entries, the next
        append (see ``_note_ack``)."""
        if self._pending:  # (a leader's: an acknowledgement flag left from following is moot)
            return len(self._pending) <= BUSY_POLL_PENDING_MAX
        return self._acked_entries

    def _busy_poll(self) -> None:
        """Keep the loop polling its sockets (a callback that reschedules itself keeps the
        loop's poll timeout at zero) while a message is expected: as leader until busy_poll_us
        after now (each turn starts the window again), as follower until busy_poll_us after its
        acknowledgement (heartbeats meanwhile do not stretch it). A turn that starts meanwhile
        runs as it would from idle."""
        now, window_s = time.perf_counter(), self.config.busy_poll_us / 1e6
        until = now + window_s if self._pending else self._acked_at + window_s
        if until <= now:
            self._acked_entries = False
            return
        start = self._poll_until == 0.0
        self._poll_until = max(self._poll_until, until)
        if start:
            asyncio.get_running_loop().call_soon(self._poll_again)

    def _poll_again(self) -> None:
        if self._expects_message() and not self._stopping and time.perf_counter() < self._poll_until:
            asyncio.get_running_loop().call_soon(self._poll_again)
        else:
            self._poll_until = 0.0
            self._acked_entries = False

    def _fail(self, err: BaseException) -> None:
        """Stop on an error of the loop or of a direct turn: recorded, logged, proposals failed."""
        self.failure = err
        log.error("node %s stopped on an error", self.config.node_id, exc_info=err)
        self._stopping = True
        self._fail_all(NodeStoppedError(f"node failed: {err!r}"))
        if self._wake is not None:
            self._wake.set()

    def _sync_plan(self, rd: Ready) -> int:
        """How the fsync of rd's writes happens, decided before any of rd is done."""
        if not (rd.entries and rd.must_sync and self.config.flush_mode == "sync"):
            return _NO_SYNC
        flusher = self._flusher()
        idle = not self._inbox and not self._proposals
        # A leader's fsync goes to the background (its appends to the followers already left as
        # early messages) except for a lone entry on an idle loop: synced inline like a
        # follower's, it saves the two thread hand-offs on the commit path, and the followers
        # fsync meanwhile.
        small = len(rd.entries) <= 2 and idle
        if self._core().can_defer_sync(rd) and not (small and not flusher.busy):
            return _DEFER
        # Else a lone entry on an idle loop is synced inline, spin-waited: its latency is the
        # point. A follower's batch is synced inline too: its answer waits for the fsync anyway,
        # and what arrives meanwhile waits in the socket and forms the next, larger batch. Other
        # group commits (a candidate's, a leader's that cannot go to the background) are awaited
        # while the loop keeps running.
        if small:
            return _SPIN
        return _INLINE if self._core().role is Role.FOLLOWER else _AWAIT

    def _truncates(self, rd: Ready) -> bool:
        return bool(rd.entries) and rd.entries[0].index <= self._store().last_index()

    async def _handle_ready(self, rd: Ready) -> bool:
        """Do what rd asks, in the loop task; returns True if its fsync was left to the
        background."""
        plan = self._sync_plan(rd)
        if self._truncates(rd):
            await self._flusher().quiesce()  # a truncation closes fds a background fsync uses
        if plan != _AWAIT:
            return self._do_ready(rd, plan)
        self._write_ready(rd)
        await self._flusher().sync_awaited()
        self._finish_ready(rd)
        return False

    def _do_ready(self, rd: Ready, plan: int) -> bool:
        """Do what rd asks, with no fsync on the thread; returns True if deferred."""
        self._write_ready(rd)
        if plan in (_INLINE, _SPIN):
            self._flusher().sync_inline(spin=plan == _SPIN)
        self._finish_ready(rd)
        return plan == _DEFER

    def _write_ready(self, rd: Ready) -> None:
        transport = self.transport
        assert transport is not None and self._hard_state is not None
        for m in rd.early_messages:
            transport.send(m)
        if rd.hard_state is not None:
            self._hard_state.save(rd.hard_state)  # atomic and fsynced
            if self.trace is not None:
                self.trace.persisted(rd.hard_state)
        if rd.entries:
            self._store().append(rd.entries)

    def _finish_ready(self, rd: Ready) -> None:
        transport = self.transport
        assert transport is not None
        for m in rd.messages:
            transport.send(m)
        if self.config.busy_poll_us and rd.entries and rd.messages and self._core().role is Role.FOLLOWER:
            self._note_ack()  # (its answer left with rd.messages)
        if rd.committed:
            self._apply(rd.committed)
            if self.trace is not None:
                self.trace.committed(rd.committed[-1])

    def _advance(self, rd: Ready, deferred: bool) -> None:
        core = self._core()
        core.advance(rd, durable=not deferred)
        if deferred:
            last = rd.entries[-1]
            self._flusher().sync_in_background((last.index, last.term, core.write_generation))

    def _apply(self, entries: Sequence[Entry]) -> None:
        pending, listeners = self._pending, self._listeners
        if pending or listeners:  # (a follower with no listener has nothing to tell)
            positions = self._store().positions_of(entries[0].index, entries[-1].index)
            if pending:
                pop = pending.pop
                for e, position in zip(entries, positions):
                    fut = pop((e.term, e.index), None)
                    if fut is not None and not fut.done():
                        fut.set_result(Committed(e.index, e.term, position))
            if listeners:
                applied = [AppliedEntry(e.index, e.term, e.kind, e.data, position)
                           for e, position in zip(entries, positions)]
                for listener in listeners:
                    listener(applied)
        top = entries[-1].index
        if self._apply_waiters:
            still = []
            for index, fut in self._apply_waiters:
                if index <= top:
                    if not fut.done():
                        fut.set_result(None)
                else:
                    still.append((index, fut))
            self._apply_waiters = still

    def _check_leadership(self) -> None:
        core = self._core()
        if self.trace is not None:
            self.trace.observe(core.status())
        if self._leader_term is None:
            return
        if core.role is not Role.LEADER or core.term != self._leader_term:
            self._leader_term = None
            self._fail_all(LeadershipLostError(
                f"leadership lost (now term {core.term}, leader {core.leader_id}); "
                f"the proposal may still commit"))

    async def _maybe_retain(self) -> None:
        keep = self.config.retention_entries
        if keep is None:
            return
        store, core = self._store(), self._core()
        target = min(core.safe_retain_index(), store.last_index() - keep)
        if target > store.first_index():
            await self._flusher().quiesce()  # retention closes files a background fsync may use
            store.retain_from(target)

    def _fail_all(self, err: ProposalError) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(_clone_error(err))
        self._pending.clear()
        while self._proposals:
            _, fut = self._proposals.popleft()
            if not fut.done():
                fut.set_exception(_clone_error(err))
        while self._control:
            _, ctl = self._control.popleft()
            if not ctl.done():
                ctl.set_exception(_clone_error(err))

    # -- accessors -------------------------------------------------------------------------------

    def _core(self) -> RaftCore:
        if self.core is None:
            raise NodeStoppedError("node not started")
        return self.core

    def _flusher(self) -> Flusher:
        if self.flusher is None:
            raise NodeStoppedError("node not started")
        return self.flusher

    def _on_flush_failure(self, err: BaseException) -> None:
        self.failure = err
        self._stopping = True
        self._kick()

    def _store(self) -> FileLogStore:
        if self.store is None:
            raise NodeStoppedError("node not started")
        return self.store


def _expire(fut: asyncio.Future[Committed], timeout_s: float) -> None:
    if not fut.done():
        fut.set_exception(ProposalTimeoutError(f"not known to be committed within {timeout_s} s"))


def _clone_error(err: ProposalError) -> ProposalError:
    """A fresh exception per future (one instance raised in many tasks tangles tracebacks)."""
    if isinstance(err, NotLeaderError):
        return NotLeaderError(err.leader_hint, err.term)
    return type(err)(*err.args)


__all__ = ["AppliedEntry", "Committed", "Node", "NodeConfig", "NodeStatus"]
