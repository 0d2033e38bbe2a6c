"""Named errors of the replicated log library.

Every failure a caller of ``dledger`` can see is one of these; input from the network or the disk
that is wrong raises one of these, never a bare assert.
"""

from __future__ import annotations


class DLedgerError(Exception):
    """Base of every error raised by the replicated log library."""


# --- proposals ---------------------------------------------------------------------------


class ProposalError(DLedgerError):
    """A proposal was not committed (or its outcome is not known)."""


class NotLeaderError(ProposalError):
    """This node is not the leader; ``leader_hint`` names the leader it knows of, if any."""

    def __init__(self, leader_hint: str | None, term: int = 0) -> None:
        super().__init__(f"not leader (leader hint: {leader_hint or 'none'}, term {term})")
        self.leader_hint = leader_hint
        self.term = term


class LeadershipTransferInProgressError(ProposalError):
    """The leader is handing leadership over and refuses new proposals until it is done."""


class OverloadedError(ProposalError):
    """Too many proposals are pending or uncommitted; retry later (DLedger: LEADER_PENDING_FULL)."""


class OutcomeUnknownError(ProposalError):
    """The proposal may or may not commit: the caller must not assume either."""


class LeadershipLostError(OutcomeUnknownError):
    """Leadership changed while the proposal was pending; it may still commit under the new leader."""


class ProposalTimeoutError(OutcomeUnknownError):
    """The deadline passed before the proposal was known to be committed."""

    sent_at: float | None = None  # when the unanswered request left (monotonic), if known


class NodeStoppedError(ProposalError):
    """The node is stopped or stopping."""


class MembershipChangeError(ProposalError):
    """A membership change the group's rules refuse now (one change at a time, one voter at a
    time, a new voter must first catch up as a learner, ...); the message says which."""


# --- storage -------------------------------------------------------------------------------


class StorageError(DLedgerError):
    """The log store cannot do what was asked."""


class CorruptLogError(StorageError):
    """An entry failed its checksum or framing check somewhere other than the torn tail."""


class CompactedError(StorageError):
    """The index asked for was deleted by retention."""


class DiskFullError(StorageError):
    """The disk has no space for the write; nothing acknowledged was lost."""


# --- connections -------------------------------------------------------------------------


class TlsError(DLedgerError):
    """A TLS handshake failed: the server's certificate is not trusted (no CA, the wrong CA, a
    host name it does not name), or one side speaks TLS and the other does not."""


# --- wire ----------------------------------------------------------------------------------


class WireError(DLedgerError):
    """A frame or payload on the wire is malformed."""


class FrameTooLargeError(WireError):
    """A frame's length prefix exceeds the maximum frame size."""
