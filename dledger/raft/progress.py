"""What a leader knows of one follower's log: match and next index, probe/replicate state,
the bounded window of appends in flight (etcd-raft's Progress, in the Raft paper's words).

Pure and small: the core decides when to send; this module only keeps the book.
"""

from __future__ import annotations

import enum
from collections import deque


class ProgressState(enum.Enum):
    PROBE = "probe"  # one append at a time until the follower's log position is found
    REPLICATE = "replicate"  # optimistic streaming, up to max_inflight appends outstanding
    SNAPSHOT = "snapshot"  # its next entry was retained away: a snapshot is on its way, no appends


class Progress:
    __slots__ = ("match_index", "next_index", "state", "probe_sent", "inflight", "max_inflight",
                 "recent_active", "last_contact_tick", "needs_send", "pending_snapshot")

    def __init__(self, next_index: int, max_inflight: int) -> None:
        self.match_index = 0
        self.next_index = next_index
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.inflight: deque[int] = deque()  # last index of each append in flight, ascending
        self.max_inflight = max_inflight
        self.recent_active = False
        self.last_contact_tick = -1
        self.needs_send = True  # send an append even if it carries no entries (a probe)
        self.pending_snapshot = 0  # in the snapshot state: the index of the snapshot being sent

    def is_paused(self) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.SNAPSHOT:
            return True
        return len(self.inflight) >= self.max_inflight

    def become_probe(self) -> None:
        self.state = ProgressState.PROBE
        self.next_index = self.match_index + 1
        self.probe_sent = False
        self.inflight.clear()

    def become_snapshot(self, snapshot_index: int) -> None:
        """A snapshot of ``snapshot_index`` is being sent: no appends until it is in (a response
        at or past it) or the shell reports the transfer failed."""
        self.state = ProgressState.SNAPSHOT
        self.pending_snapshot = snapshot_index
        self.probe_sent = False
        self.needs_send = False
        self.inflight.clear()

    def snapshot_done(self, ok: bool) -> None:
        """The shell's word on the transfer: probe from past the snapshot if it went through,
        else from the match index (which asks for a snapshot again). Either way the next probe
        waits for a heartbeat's answer, so a failing transfer is retried once a heartbeat."""
        pending = self.pending_snapshot
        self.become_probe()
        if ok:
            self.next_index = max(self.next_index, pending + 1)
        self.pending_snapshot = 0
        self.probe_sent = True

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next_index = self.match_index + 1
        self.probe_sent = False
        self.inflight.clear()

    def sent(self, last_index: int) -> None:
        """An append covering entries up to last_index was sent."""
        self.needs_send = False
        if self.state is ProgressState.REPLICATE:
            self.next_index = last_index + 1
            self.inflight.append(last_index)
        else:
            self.probe_sent = True

    def maybe_update(self, index: int) -> bool:
        """A success response says the follower matches up to index. False if it is stale."""
        updated = index > self.match_index
        if updated:
            self.match_index = index
            self.probe_sent = False
        if self.next_index < index + 1:
            self.next_index = index + 1
        while self.inflight and self.inflight[0] <= index:
            self.inflight.popleft()
        return updated

    def maybe_decrease_to(self, rejected_index: int, probe_hint_index: int) -> bool:
        """A rejection of the append whose prev_log_index was rejected_index. False if stale."""
        if self.state is ProgressState.SNAPSHOT:
            return False  # (an answer to an append sent before the snapshot)
        if self.state is ProgressState.REPLICATE:
            if rejected_index < self.match_index:
                return False
            if rejected_index == self.match_index:
                if probe_hint_index >= self.match_index:
                    return False
                # The follower no longer holds what it acknowledged (its disk was replaced, or
                # an async-flush follower lost its page cache): believe it, or every append from
                # here on is refused and it is never repaired. (A stale refusal that lands here
                # only costs a resend: match_index is a lower bound, commits never go back.)
                self.match_index = probe_hint_index
            self.next_index = self.match_index + 1
            return True
        if self.next_index - 1 != rejected_index:
            return False
        if rejected_index == self.match_index and probe_hint_index < self.match_index:
            # The follower no longer holds what it acknowledged (an async-flush follower lost
            # its page cache, or its disk was replaced): believe it, or it is never repaired.
            self.match_index = probe_hint_index
        self.next_index = max(min(rejected_index, probe_hint_index + 1), self.match_index + 1)
        self.probe_sent = False
        return True

    def free_first_one(self) -> None:
        if self.inflight:
            self.inflight.popleft()
