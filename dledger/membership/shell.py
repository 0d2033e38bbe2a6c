"""Membership changes in a node (``MembershipShell``, a part of ``dledger.node.runtime.Node``): the
shell around ``dledger.raft.membership``.

Owns the operations an operator asks of a group's leader (add a learner, promote it once it has
caught up, remove a member; each waits until its change is committed), the peer links following
the membership in force (new members dialed at the address their membership entry records, or
``--dial``/``--peers``), and the ``recovering`` marker of a node that joins on an empty disk
(``recovering`` in ``dledger.raft.core``): written when a ``--join`` node finds no term and vote,
removed once its core has caught up, so that a restart in between still knows.
Membership changes need snapshots (an application's ``SnapshotProvider``): the membership is
saved with each snapshot, and a restart reads the changes the log holds after it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from dledger.node.base import NodeBase
from dledger.node.config import Address, Committed
from dledger.raft.progress import ProgressState
from dledger.raft.types import Membership, Role
from protocol.errors import MembershipChangeError, ProposalTimeoutError

__all__ = ["RECOVERING_FILE", "MembershipShell", "parse_address"]

log = logging.getLogger("dledger.membership")

RECOVERING_FILE = "recovering"  # present while a node that started on an empty disk catches up
CATCH_UP_POLL_S = 0.05


def parse_address(text: str) -> Address:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a host:port address: {text!r}")
    return host, int(port)


async def _until(met: Callable[[], bool], deadline: float, why: str) -> None:
    """Poll the core's view (on the loop, between its turns) until ``met``; past ``deadline``,
    ProposalTimeoutError(``why``)."""
    while not met():
        if time.monotonic() > deadline:
            raise ProposalTimeoutError(why)
        await asyncio.sleep(CATCH_UP_POLL_S)


class MembershipShell(NodeBase):
    """Membership changes and the peer links (a part of ``dledger.node.runtime.Node``)."""

    # -- operations (on the leader) ----------------------------------------------------------------

    async def add_learner(self, node_id: str, address: str, timeout_s: float = 10.0) -> Committed:
        """Add ``node_id`` (peer address ``host:port``) as a learner: it gets the log, and counts
        for nothing until promoted."""
        parse_address(address)

        def change(m: Membership) -> Membership:
            if node_id in m.members:
                raise MembershipChangeError(f"{node_id} is a member already")
            return Membership(m.voters, tuple(sorted((*m.learners, node_id))),
                              self._addresses(m, {node_id: address}))
        return await self._change(change, timeout_s)

    async def promote(self, node_id: str, timeout_s: float = 30.0) -> Committed:
        """Make learner ``node_id`` a voter, once it has caught up (waiting for that, within
        ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        await _until(lambda: self._caught_up(node_id), deadline,
                     f"learner {node_id} did not catch up within {timeout_s} s")

        def change(m: Membership) -> Membership:
            if node_id not in m.learners:
                raise MembershipChangeError(f"{node_id} is not a learner")
            return Membership(tuple(sorted((*m.voters, node_id))),
                              tuple(x for x in m.learners if x != node_id),
                              self._addresses(m))
        return await self._change(change, max(1.0, deadline - time.monotonic()))

    async def remove_member(self, node_id: str, timeout_s: float = 10.0) -> Committed:
        """Remove voter or learner ``node_id`` (this node too: it leads until the change
        commits, then steps down)."""
        def change(m: Membership) -> Membership:
            if node_id not in m.members:
                raise MembershipChangeError(f"{node_id} is not a member")
            return Membership(tuple(x for x in m.voters if x != node_id),
                              tuple(x for x in m.learners if x != node_id),
                              tuple(a for a in self._addresses(m) if a[0] != node_id))
        return await self._change(change, timeout_s)

    def _caught_up(self, node_id: str) -> bool:
        core = self._core()
        pr = core.progress.get(node_id)
        return (pr is not None and pr.state is ProgressState.REPLICATE
                and core.log.commit_index - pr.match_index <= core.config.lazy_batch_entries)

    async def _change(self, change: Callable[[Membership], Membership],
                      timeout_s: float) -> Committed:
        if self._snapshot_provider is None:
            raise MembershipChangeError("membership changes need snapshots (a broker's node)")
        deadline = time.monotonic() + timeout_s
        await self._until_term_committed(deadline)
        fut: asyncio.Future[Committed] = asyncio.get_running_loop().create_future()

        def op() -> None:
            core = self._core()
            term, index = core.propose_membership(change(core.membership))
            self._pending[(term, index)] = fut
            self._leader_term = core.term
        await self._in_loop(op)
        return await self._await(fut, max(0.001, deadline - time.monotonic()))

    async def _until_term_committed(self, deadline: float) -> None:
        """A leader takes a change only once an entry of its term is committed (Raft's rule for
        one-at-a-time changes; the core refuses it before). A leader just elected, or handed
        leadership by a transfer, commits its term's no-op within a round trip: a change asked
        for meanwhile waits for that rather than being refused; a node that is not the leader
        goes on at once (the core says NOT_LEADER)."""
        def term_committed() -> bool:
            core = self._core()
            return core.role is not Role.LEADER or core.log.commit_index >= core.term_start_index
        await _until(term_committed, deadline,
                     "this leader did not commit an entry of its term in time for the change")

    def _addresses(self, m: Membership, extra: dict[str, str] | None = None
                   ) -> tuple[tuple[str, str], ...]:
        """Every member's peer address as far as this node knows, for the next membership."""
        known = {nid: f"{h}:{p}" for nid, (h, p) in self.config.peers.items()}
        known.update(dict(m.addresses))
        known.update(extra or {})
        members = set(m.members) | set(extra or {})
        return tuple(sorted((nid, a) for nid, a in known.items() if nid in members))

    # -- the peer links follow the membership --------------------------------------------------

    def _follow_membership(self) -> None:
        """After each turn: dial the members of the membership in force (once it changed), and
        remove the recovering marker once the core has caught up."""
        core, transport = self.core, self.transport
        if core is None or transport is None:
            return
        if self._recovering_marker and not core.recovering:
            self._recovering_marker = False
            try:
                if self._given_hard_state is None:  # (else it was kept in memory)
                    os.unlink(os.path.join(self.config.data_dir, RECOVERING_FILE))
            except FileNotFoundError:
                pass
        if core.membership is self._linked_membership:
            return
        self._linked_membership = m = core.membership
        _, _, index, pending = core.membership_status()
        self.events.observe_membership(m, index, pending)
        for nid in m.members:
            if nid != self.config.node_id:
                addr = self._peer_address(nid, m)
                if addr is not None:
                    transport.set_dial(nid, addr)

    def _peer_address(self, nid: str, m: Membership) -> Address | None:
        """Where to dial ``nid``: its --dial entry, else the membership's address, else --peers."""
        addr = self.config.dial.get(nid)
        text = m.address_of(nid)
        if addr is None and text is not None:
            try:
                addr = parse_address(text)
            except ValueError:
                log.warning("%s: member %s has a bad address %r", self.config.node_id, nid, text)
        return addr or self.config.peers.get(nid)

    def _resolve_peer(self, nid: str, said: Address) -> Address | None:
        """Where to dial a peer that dialed this node and that it has no link to (the
        transport's ``resolve``): only a node catching up on an empty disk does (it knew only
        its ``--peers``, and the leader may be a member added since), at its ``--dial`` entry
        (a fault proxy in the chaos suite) or where the peer's Hello said. Any other node links
        to the members of its membership only."""
        core = self.core
        if core is None or not core.recovering:
            return None
        return self.config.dial.get(nid) or said

    def _recovering_at_start(self, has_state: bool) -> bool:
        """Whether this node joins on an empty disk (``--join``: a new member, or one whose disk
        was replaced; ``has_state``: its hard-state store holds a term or vote), or had not
        caught up since it did. (A node of a new group also starts with no term and vote, but
        it has acknowledged nothing it could have forgotten.) The marker is a file beside the
        node's own hard state; with a given hard-state store it lives in memory only."""
        if self._given_hard_state is not None:
            self._recovering_marker = self.config.join and not has_state
            return self._recovering_marker
        marker = os.path.join(self.config.data_dir, RECOVERING_FILE)
        if self.config.join and not has_state and not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write("this node started on an empty disk: it votes once caught up\n")
        self._recovering_marker = os.path.exists(marker)
        return self._recovering_marker

    def membership_status(self) -> dict[str, object]:
        core = self._core()
        voters, learners, index, pending = core.membership_status()
        return {"voters": list(voters), "learners": list(learners), "config_index": index,
                "change_in_progress": pending, "recovering": core.recovering}
