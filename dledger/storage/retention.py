"""Retention rules: which old commitlog segments a node deletes, RocketMQ's way, within what Raft
and the state machine allow. Pure: the node's shell gives it the segments (first index and last
write time of each), the clock and the disk's usage; it answers the index to retain from.

The rules, each allowing a deletion on its own (``RetentionPolicy``):
- by count: keep at least ``keep_entries`` entries (``--retention-entries``);
- by age (RocketMQ's ``fileReservedTime``, 72 h): a segment last written longer ago than that is
  expired; expired segments are deleted during the daily deletion hours (``deleteWhen``, 04),
  or at any hour once the disk is fuller than ``disk_max_used_ratio`` (``diskMaxUsedSpaceRatio``);
- by space: past ``disk_forcibly_ratio`` (``diskSpaceCleanForciblyRatio``) the oldest segment
  goes even if it has not expired, one a round, until the disk is below it.

And the bounds no rule passes (``retain_target``): the last segment stays (it is being written);
nothing past the latest snapshot, the applied index or what is durable here; and what a lagging
member still needs, unless it lags by more than ``lag_entries`` (it is sent a snapshot instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["RetentionPolicy", "SegmentAge", "policy_target", "retain_target"]


@dataclass(frozen=True)
class RetentionPolicy:
    keep_entries: int | None = None
    reserved_hours: float | None = 72.0  # None: no age rule
    delete_hours: tuple[int, ...] = (4,)  # local hours at which expired segments are deleted
    disk_max_used_ratio: float = 0.75
    disk_forcibly_ratio: float = 0.85

    def __post_init__(self) -> None:
        if self.keep_entries is not None and self.keep_entries < 1:
            raise ValueError("keep_entries must be at least 1")
        if self.reserved_hours is not None and self.reserved_hours < 0:
            raise ValueError("reserved_hours must not be negative")
        if not all(0 <= h <= 23 for h in self.delete_hours):
            raise ValueError("delete hours are 0..23")
        if not 0.0 <= self.disk_max_used_ratio <= self.disk_forcibly_ratio <= 1.0:
            raise ValueError("need 0 <= disk_max_used_ratio <= disk_forcibly_ratio <= 1")

    @property
    def deletes_anything(self) -> bool:
        return (self.keep_entries is not None or self.reserved_hours is not None
                or self.disk_forcibly_ratio < 1.0)


@dataclass(frozen=True, slots=True)
class SegmentAge:
    first_index: int
    written_at_s: float  # wall-clock seconds of its last write (the file's mtime)


def policy_target(policy: RetentionPolicy, segments: Sequence[SegmentAge], last_index: int,
                  now_s: float, local_hour: int, disk_used_ratio: float) -> int:
    """The index the rules would retain from (1: delete nothing), before the bounds."""
    target = 1
    if policy.keep_entries is not None:
        target = max(target, last_index - policy.keep_entries + 1)
    sealed = list(segments[:-1])  # (the last segment is never deleted)
    if policy.reserved_hours is not None and (local_hour in policy.delete_hours
                                              or disk_used_ratio >= policy.disk_max_used_ratio):
        horizon = now_s - policy.reserved_hours * 3600.0
        for k, seg in enumerate(sealed):
            if seg.written_at_s >= horizon:
                break
            target = max(target, segments[k + 1].first_index)
    if sealed and disk_used_ratio >= policy.disk_forcibly_ratio:
        target = max(target, segments[1].first_index)  # the oldest goes, expired or not
    return target


def retain_target(policy_index: int, *, applied_index: int, snapshot_index: int,
                  durable_index: int, members_need_index: int, last_index: int,
                  lag_entries: int) -> int:
    """The index to retain from: the rules' choice within the bounds (see the module docstring).
    ``members_need_index``: the lowest index some member still needs (Raft's match indexes)."""
    own = min(applied_index, snapshot_index, durable_index) + 1
    members = max(members_need_index, last_index - lag_entries)
    return min(policy_index, own, members)
