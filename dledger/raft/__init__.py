"""The Raft consensus core: pure, deterministic, no I/O (see DESIGN.md section 1)."""

from dledger.raft.types import (
    AppendRequest,
    AppendResponse,
    Entry,
    EntryKind,
    FollowerStatus,
    HardState,
    Heartbeat,
    HeartbeatResponse,
    LogReader,
    Message,
    Ready,
    Role,
    Status,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)

__all__ = [
    "AppendRequest",
    "AppendResponse",
    "Entry",
    "EntryKind",
    "FollowerStatus",
    "HardState",
    "Heartbeat",
    "HeartbeatResponse",
    "LogReader",
    "Message",
    "Ready",
    "Role",
    "Status",
    "TimeoutNow",
    "VoteRequest",
    "VoteResponse",
]
