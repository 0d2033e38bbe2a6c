"""Busy polling (``NodeConfig.busy_poll_us``): while a message is expected soon, the node keeps
its event loop polling the sockets instead of sleeping, so that the message is read as it lands,
not after the CPU wakes from idle.

Owns when a message is expected (as leader, an acknowledgement of a few proposals awaiting
commit; as follower that just acknowledged entries, the next append) and the polling window.
It must not step the core: a turn that starts meanwhile runs as it would from idle.
"""

from __future__ import annotations

import asyncio
import time

from dledger.node.base import NodeBase

__all__ = ["BUSY_POLL_PENDING_MAX", "BUSY_POLL_PROPOSED_BYTES_MAX", "BusyPolling"]

# A leader polls for acknowledgements only while at most this many proposals await commit (a
# lone proposer's, or a short burst), and only if the last batch it proposed came to at most
# this many bytes: a bigger batch's round trip is long (the followers decode, write and fsync all
# of it), and on a box with fewer cores than replicas polling through it only takes CPU from the
# followers doing that work. (A broker's send entry of 64 messages of 128 B is about 12 KiB: the
# servers' CPU per message in the bench's 64-topic row read 6% lower without the polling, at the
# same rate; a lone send's entry is about 300 B.)
BUSY_POLL_PENDING_MAX = 4
BUSY_POLL_PROPOSED_BYTES_MAX = 4096


class BusyPolling(NodeBase):
    """The node's busy polling (a part of ``dledger.node.runtime.Node``)."""

    def _note_ack(self) -> None:
        """A follower answered an append of entries. It polls for the next one only if the last
        one came within the polling window of the answer before it: a lone proposer's next
        entry does, one round trip later; under load the leader takes longer to gather the next
        batch, and polling would only take CPU from it (and from the other processes)."""
        now = time.perf_counter()
        idle_s, self._acked_at = self._turn_started_at - self._acked_at, now
        self._acked_entries = idle_s * 1e6 <= self.config.busy_poll_us

    def _expects_message(self) -> bool:
        """A message is due soon: as leader, an acknowledgement of a few small proposals
        awaiting commit (see BUSY_POLL_PENDING_MAX); as follower that just acknowledged entries, the next
        append (see ``_note_ack``)."""
        if self._pending:  # (a leader's: an acknowledgement flag left from following is moot)
            return len(self._pending) <= BUSY_POLL_PENDING_MAX \
                and self._proposed_bytes <= BUSY_POLL_PROPOSED_BYTES_MAX
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
