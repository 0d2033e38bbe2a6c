"""Quorum arithmetic: majority-committed index and vote tallies. Pure functions."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping


class VoteResult(enum.Enum):
    PENDING = "pending"
    WON = "won"
    LOST = "lost"


def majority(voter_count: int) -> int:
    return voter_count // 2 + 1


def committed_index(match_indexes: Iterable[int]) -> int:
    """The highest index held by a majority (the majority-th largest match index)."""
    ordered = sorted(match_indexes, reverse=True)
    if not ordered:
        return 0
    return ordered[majority(len(ordered)) - 1]


def vote_result(voters: Iterable[str], votes: Mapping[str, bool]) -> VoteResult:
    voters = tuple(voters)
    need = majority(len(voters))
    granted = sum(1 for v in voters if votes.get(v) is True)
    rejected = sum(1 for v in voters if votes.get(v) is False)
    if granted >= need:
        return VoteResult.WON
    if rejected >= need or len(voters) - rejected < need:
        return VoteResult.LOST
    return VoteResult.PENDING
