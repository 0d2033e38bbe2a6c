"""Configuration of one Raft core: timing in ticks, flow-control bounds, options, canaries.

Owns only values and their validation; the shell turns wall time into ticks.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Canaries:
    """Seeded bugs, for tests only: each breaks one safety rule so the checkers can prove they fire.

    Never set in production; the runtime refuses them unless started with test faults enabled.
    """

    forget_vote: bool = False  # hard state handed to the shell never carries voted_for
    commit_previous_term: bool = False  # commit entries of earlier terms by counting (Figure 8)
    ack_before_fsync: bool = False  # follower answers appends before its entries are durable
    truncate_on_append: bool = False  # follower cuts its log after every append, matched or not
    count_self_before_durable: bool = False  # leader counts its own copy before its fsync
    commit_without_quorum: bool = False  # leader commits (and acks) its own copy alone
    no_pre_vote_check_quorum: bool = False  # run without Pre-Vote and CheckQuorum
    skip_checksum: bool = False  # storage trusts its files: no checksum check on recovery/reads
    # a shell whose fsync failed for want of space carries on as if it had succeeded (the
    # naive "stay up on a full disk"); the simulator's full-disk faults must catch it.
    # Simulator only (SIM_ONLY_CANARIES): a node process does not offer it.
    ignore_failed_fsync: bool = False
    # a follower restores a snapshot even at or below its commit index (committed state moves
    # back: the entries after the snapshot are applied a second time)
    snapshot_below_commit: bool = False
    # a leader appends a new membership while the previous one is not committed yet (two
    # changes at once: the old and the newest configurations' majorities need not overlap)
    membership_two_at_once: bool = False
    # a candidate also counts (and asks for) the votes of the initial voters it has removed since
    membership_count_removed: bool = False
    # a restarted node forgets the membership changes its log and snapshot hold: it starts with
    # the configured voters (the --peers of its command line)
    membership_forget_on_restart: bool = False
    # the shell installs a snapshot's log but not its state: the state machine goes on applying
    # the entries after the snapshot over a state that skipped those before. Simulator only.
    snapshot_skips_state: bool = False

    def any(self) -> bool:
        return any(getattr(self, name) for name in self.__dataclass_fields__)


SIM_ONLY_CANARIES = frozenset({"ignore_failed_fsync", "snapshot_skips_state"})


@dataclass(frozen=True)
class RaftConfig:
    node_id: str
    # The initial voters (this node included, unless it joins): the membership in force until
    # the log or a snapshot says otherwise (dledger.raft.membership).
    voters: tuple[str, ...]
    election_ticks: int = 10  # election timeout is drawn from [election_ticks, 2 * election_ticks)
    heartbeat_ticks: int = 1
    check_quorum: bool = True
    pre_vote: bool = True
    preferred_leader: str | None = None
    max_append_entries: int = 512  # per AppendRequest
    max_append_bytes: int = 1 << 20  # per AppendRequest (at least one entry is always sent)
    max_inflight: int = 32  # AppendRequests in flight per follower in the replicate state
    max_uncommitted_bytes: int = 64 << 20  # proposals beyond this raise OverloadedError
    max_apply_bytes: int = 4 << 20  # committed entries handed out in one Ready
    max_cache_bytes: int = 8 << 20  # recently persisted entries kept in memory
    # Quorum-first replication: new entries go at once only to the followers a commit needs
    # (quorum - 1 of them, picked each tick among those that answered lately, the most caught up
    # first); the others get them in batches of lazy_batch_entries, at every heartbeat, and
    # whenever they must be probed. Fewer messages and fsyncs per commit; a commit then waits
    # for the picked followers (no hedge), and a picked follower that dies costs up to two ticks.
    # A lazy follower's batch is large so that its fsyncs are rare: on a disk the replicas share,
    # each one delays the commit path's own (with batches of 8, one commit in five of a lone
    # proposer took 1.5 to 2 times as long; at 64 proposals in flight, batches of 1024 gave
    # 17-27% more commits/s than batches of 256).
    quorum_first: bool = False
    lazy_batch_entries: int = 1024
    canaries: Canaries = field(default_factory=Canaries)
    # A node joining a running group: no membership until the leader's log or snapshot brings
    # one (it neither campaigns nor votes before).
    join: bool = False

    def __post_init__(self) -> None:
        if self.node_id not in self.voters and not self.join:
            raise ValueError(f"node {self.node_id!r} is not among the voters {self.voters}")
        if len(set(self.voters)) != len(self.voters):
            raise ValueError(f"duplicate voters in {self.voters}")
        if self.heartbeat_ticks < 1 or self.election_ticks <= self.heartbeat_ticks:
            raise ValueError("need 1 <= heartbeat_ticks < election_ticks")
        if self.preferred_leader is not None and self.preferred_leader not in self.voters:
            raise ValueError(f"preferred leader {self.preferred_leader!r} is not a voter")
        if self.max_inflight < 1 or self.max_append_entries < 1:
            raise ValueError("max_inflight and max_append_entries must be >= 1")
        if self.lazy_batch_entries < 1:
            raise ValueError("lazy_batch_entries must be >= 1")

