"""What a node counts for its operators (``/metrics``): elections it started, leader changes it
saw, retention runs and the entries they deleted, and each fsync's duration (to an observer, and
to the node's log of slow fsyncs: ``dledger.node.oplog``).

Plain cumulative numbers since the process started, kept by the node's shell (the Raft core
stays pure) and read at scrape time; durations go to an optional observer (a histogram of the
broker's metrics) so this package needs no metrics library.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["NodeStats"]


@dataclass(slots=True)
class NodeStats:
    elections_started: int = 0  # times this node became a candidate (a new term it asked for)
    leader_changes: int = 0  # times the leader it knows changed to another node
    retention_runs: int = 0  # times retention deleted segments
    retention_entries_deleted: int = 0
    fsync_observer: Callable[[float], None] | None = None  # each fsync's duration, in seconds
    fsync_logger: Callable[[float], None] | None = None  # the same, to the node's log
    _term: int = 0
    _leader: str | None = None

    def observe_role(self, term: int, leader: str | None, candidate: bool) -> bool:
        """After a step: count a new candidacy and a change of the known leader; True if the
        leader changed."""
        if term != self._term:
            self._term = term
            if candidate:
                self.elections_started += 1
        if leader is not None and leader != self._leader:  # (the first leader it knows counts)
            self.leader_changes += 1
            self._leader = leader
            return True
        return False

    def fsync_done(self, seconds: float) -> None:
        """A group commit made durable (inline, awaited or in the background) in ``seconds``."""
        observer = self.fsync_observer
        if observer is not None:
            observer(seconds)
        logger = self.fsync_logger
        if logger is not None:
            logger(seconds)

    def retained(self, entries_deleted: int) -> None:
        if entries_deleted > 0:
            self.retention_runs += 1
            self.retention_entries_deleted += entries_deleted
