"""The node runtime: one asyncio task owns a Raft core and drives it
(tick -> step -> ready -> persist -> send -> apply -> advance), around its log store, hard-state
store and transport (given to it, or its own files and TCP links: ``dledger.node.seams``). This
is the imperative shell of docs/design.md

``Node`` is made of parts, each a module: ``node_config`` (configuration and the values the API
hands out), ``node_base`` (the fields the parts share), ``seams`` (what it runs on), ``proposals``
(pending proposals: futures keyed by (term, index), resolved when that entry is applied with the
same term, failed when leadership changes), ``ready_pipeline`` (persist, send, apply, advance: one
fsync per Ready before anything that depends on it leaves in the ``sync`` flush mode; retention) and
``busy_poll``. This module owns the node's lifecycle, its inputs (the bounded inbox, control ops,
wake-ups), the loop task and the direct turns, the ``async`` flush mode's periodic flush (page cache
in between), apply listeners and the node's status. No part may interpret entry bodies: that is the
state machine's business (the broker).

While the loop task is parked with nothing to do, a message or proposal that arrives is handled
at once, in the callback that brought it (``_turn_now``), rather than by waking the task: on the
one-at-a-time latency path that saves a task switch on every hop. Such a turn never awaits; a
Ready that must wait for the disk is handed to the task.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from dledger.membership.shell import MembershipShell
from dledger.node.busy_poll import BUSY_POLL_PENDING_MAX, BUSY_POLL_PROPOSED_BYTES_MAX
from dledger.node.config import (
    MAX_BUSY_POLL_US,
    Address,
    AppliedEntry,
    ApplyListener,
    Committed,
    FlushMode,
    NodeConfig,
    NodeStatus,
)
from dledger.node.disk_full import DiskFullRecovery
from dledger.node.ready_pipeline import AWAIT, ReadyPipeline
from dledger.node.seams import LOG_DIR, NodeSeams
from dledger.node.trace import NodeTrace
from dledger.raft.types import Message, Role
from dledger.snapshots.files import finish_install
from dledger.snapshots.shell import SnapshotShell
from protocol.errors import (
    DiskFullError,
    DLedgerError,
    NodeStoppedError,
    NotLeaderError,
    ProposalTimeoutError,
    StorageError,
)

log = logging.getLogger("dledger.node.runtime")

RETAIN_INTERVAL_S = 1.0
TIMER_SLACK_S = 0.001  # event loops may wake a timer up to a millisecond early


class Node(SnapshotShell, MembershipShell, ReadyPipeline, DiskFullRecovery, NodeSeams):
    """One member of a replicated log group: ``Node(config, *, applied_index=0, rng=None,
    log_store=None, hard_state=None, transport=None)``; without stores and a transport it
    opens its own files in ``config.data_dir`` and its TCP links (``dledger.node.seams``)."""

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> Address:
        """Open storage, recover, start the transport and the loop; returns the peer address."""
        cfg = self.config
        provider = self._snapshot_provider
        self._check_seams()
        if self._owns_files:
            os.makedirs(cfg.data_dir, exist_ok=True)
        if self._given_log is None:
            finish_install(cfg.data_dir, LOG_DIR, provider.snapshot_derived() if provider else ())
        self._hard_state, has_state = self._open_hard_state()
        self._recovering_at_start(has_state)
        self._open_core(self._applied_floor)
        if cfg.trace_path is not None:
            self.trace = NodeTrace(cfg.trace_path, cfg.node_id)
        self.transport = self._open_transport(
            self._on_message, self._on_snapshot_stream if provider else None, self._resolve_peer)
        self.peer_address = await self.transport.start()  # (nothing turns before the task runs)
        self.flusher = self._open_flusher(self._store())
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
        await self._stop_snapshots()
        if self.flusher is not None:
            await self.flusher.close()
        if self.transport is not None:
            await self.transport.stop()
        self._fail_all(NodeStoppedError("node stopped"))
        if self.store is not None and not self._power_lost:
            if self.config.flush_mode == "async" and self.failure is None and self._disk_full is None:
                self.store.sync()
            self._close_log()  # (a given store stays open: its owner closes it)
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
        the last fsync. The caller kills the process right after. Returns the bytes discarded
        (entries, for a ``MemoryLogStore``: ``dledger.node.seams``)."""
        if not self.config.test_faults:
            raise PermissionError("power_loss needs test_faults=True")
        self._stopping = True
        self._kick()
        await self.join()
        await self._flusher().quiesce()
        self._power_lost = True
        return self._lose_power(tear)

    # -- public API ----------------------------------------------------------------------------
    def add_apply_listener(self, listener: ApplyListener) -> None:
        """Call listener with every batch of applied entries, in log order, from the loop."""
        self._listeners.append(listener)

    async def read_barrier(self, timeout_s: float = 3.0) -> None:
        """Return once this node leads and has applied everything committed before its term
        (its no-op), so reads of applied state see every earlier commit (Raft section 8).
        Raises NotLeaderError or ProposalTimeoutError."""
        core = self._core()
        if not self.is_leader:
            raise NotLeaderError(core.leader_id if self._disk_full is None else None, core.term)
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
        store, raft, full = self._store(), self._core().status(), self._disk_full
        return NodeStatus(
            group=self.config.group, raft=raft if full is None else self._disk_full_status(raft),
            flush_mode=self.config.flush_mode,
            peer_address=self.peer_address, pending_proposals=len(self._pending) + len(self._proposals),
            inbox_dropped=self._inbox_dropped,
            transport=self.transport.stats() if self.transport else {},
            storage_first_index=store.first_index(), storage_last_index=store.last_index(),
            disk_full=full is not None, disk_full_error=None if full is None else str(full),
            snapshot=self.snapshot_status(), membership=self.membership_status(),
            last_heard_s=dict(self.last_heard_s))

    @property
    def is_leader(self) -> bool:
        return self.core is not None and self.core.role is Role.LEADER and self._disk_full is None

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
        self.last_heard_s[m.src] = time.time()
        if len(self._inbox) >= self.config.inbox_max:
            self._inbox_dropped += 1  # Raft tolerates loss; the sender will retry
            return
        self._inbox.append(m)

    def _in_loop(self, op: Callable[[], None]) -> asyncio.Future[None]:
        """Run op on the core from the loop, between Readies (the core has one owner)."""
        if self._stopping or self._task is None:
            raise NodeStoppedError("node is not running")
        if self._disk_full is not None:
            raise DiskFullError(f"{self.config.node_id} cannot write: {self._disk_full}")
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
        wake = self._wake
        if wake is None:
            raise RuntimeError("the node loop runs only after start() made its wake event")
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
                        await wake.wait()
                    finally:
                        self._parked = False
                    if self._stopping:
                        break
                if self._disk_full is not None:
                    await self._ride_out_disk_full()
                    if self._stopping:
                        break
                    now = loop.time()  # (ticks while frozen are not replayed; the turn below
                    next_tick, next_retain = now + tick_s, now + RETAIN_INTERVAL_S  # re-arms)
                wake.clear()
                try:
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
                except DiskFullError as err:  # the node stays up, riding it out (dledger.node.disk_full)
                    self._enter_disk_full(err)
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

    async def _drain_ready(self) -> None:
        core = self._core()
        for _ in range(10_000):
            if self._disk_full is not None or not core.has_ready():  # (frozen by a callback)
                break
            rd = core.ready()
            self._advance(rd, await self._handle_ready(rd))
        self._check_leadership()
        self._follow_membership()

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
                if plan == AWAIT or rd.snapshot is not None or (flusher.busy and self._truncates(rd)):
                    self._handoff = rd
                    break
                self._advance(rd, self._do_ready(rd, plan))
            self._check_leadership()
            self._follow_membership()
        except DiskFullError as err:  # the node stays up, riding it out (dledger.node.disk_full)
            self._enter_disk_full(err)
        except Exception as err:  # recorded, logged and stops the node, as in the loop task
            self._fail(err)
        finally:
            self._turning = False
        if self._handoff is not None or self._inbox or self._proposals:
            if self._wake is not None:  # (set by start(), before any turn)
                self._wake.set()
        elif self.config.busy_poll_us and self._expects_message():
            self._busy_poll()

    def _fail(self, err: BaseException) -> None:
        """Stop on an error of the loop or of a direct turn: recorded, logged, proposals failed."""
        self.failure = err
        log.error("node %s stopped on an error", self.config.node_id, exc_info=err)
        self._stopping = True
        self._fail_all(NodeStoppedError(f"node failed: {err!r}"))
        if self._wake is not None:
            self._wake.set()

    def _on_flush_failure(self, err: BaseException) -> None:
        full = err if isinstance(err, DiskFullError) else self._disk_full
        if full is not None and isinstance(err, StorageError):
            # (once full, the store's other refusals are that same failure: it is reopened)
            self._enter_disk_full(full)
            return
        self.failure = err
        self._stopping = True
        self._kick()


__all__ = [
    "BUSY_POLL_PENDING_MAX",
    "BUSY_POLL_PROPOSED_BYTES_MAX",
    "MAX_BUSY_POLL_US",
    "Address",
    "AppliedEntry",
    "ApplyListener",
    "Committed",
    "FlushMode",
    "Node",
    "NodeConfig",
    "NodeStatus",
]
