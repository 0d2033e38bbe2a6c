"""A node's proposals and the futures of its callers: ``propose`` / ``submit`` queue data for the
log, the loop hands batches to the core, and each proposal's future is keyed by (term, index):
it resolves when that entry is applied with the same term (``ready_pipeline``) and fails when
leadership changes or the node stops. Also the futures of ``wait_applied``.

Owns the bounded queue of proposals (``OverloadedError`` past ``max_pending_proposals``), each
caller's deadline (``ProposalTimeoutError``: outcome unknown) and failing every waiter with a
named error. It must not persist or apply anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from dledger.node.base import NodeBase
from dledger.node.config import Committed
from dledger.raft.types import Role
from protocol.errors import (
    DiskFullError,
    LeadershipLostError,
    NodeStoppedError,
    NotLeaderError,
    OverloadedError,
    ProposalError,
    ProposalTimeoutError,
)

__all__ = ["Proposals"]


class Proposals(NodeBase):
    """Proposals and their futures (a part of ``dledger.node.runtime.Node``)."""

    async def propose(self, data: bytes, timeout_s: float = 3.0) -> Committed:
        """Replicate data; returns once it is committed and applied here.

        Raises NotLeaderError (with a leader hint), OverloadedError, LeadershipLostError or
        ProposalTimeoutError (outcome unknown), NodeStoppedError."""
        return await self._await(self.submit(data), timeout_s)

    async def propose_batch(self, items: Sequence[bytes], timeout_s: float = 3.0) -> list[Committed]:
        futs = [self.submit(d) for d in items]
        return [await self._await(f, timeout_s) for f in futs]

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

    def submit(self, data: bytes) -> asyncio.Future[Committed]:
        """Queue a proposal; the future ends committed, or with a named error (leadership lost,
        node stopped). It has no deadline of its own: ``propose`` adds one."""
        if self._stopping or self._task is None:
            raise NodeStoppedError("node is not running")
        core = self._core()
        if core.role is not Role.LEADER or self._disk_full is not None:
            if self._disk_full is not None:  # (its core is frozen: dledger.node.disk_full)
                raise DiskFullError(f"{self.config.node_id} cannot write: {self._disk_full}")
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
        size = 0
        for (term, index), (data, fut) in zip(placed, batch):
            self._pending[(term, index)] = fut
            size += len(data)
        self._proposed_bytes = size
        self._leader_term = core.term

    def _check_leadership(self) -> None:
        core = self._core()
        if self.trace is not None:
            self.trace.observe(core.status())
        self.stats.observe_role(core.term, core.leader_id, core.role is Role.CANDIDATE)
        self.events.observe(core.role, core.term, core.leader_id, core.voted_for)
        if self._leader_term is None:
            return
        if core.role is not Role.LEADER or core.term != self._leader_term:
            self._leader_term = None
            self._fail_all(LeadershipLostError(
                f"leadership lost (now term {core.term}, leader {core.leader_id}); "
                f"the proposal may still commit"))

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


def _expire(fut: asyncio.Future[Committed], timeout_s: float) -> None:
    if not fut.done():
        fut.set_exception(ProposalTimeoutError(f"not known to be committed within {timeout_s} s"))


def _clone_error(err: ProposalError) -> ProposalError:
    """A fresh exception per future (one instance raised in many tasks tangles tracebacks)."""
    if isinstance(err, NotLeaderError):
        return NotLeaderError(err.leader_hint, err.term)
    return type(err)(*err.args)
