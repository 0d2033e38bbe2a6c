"""Plain data of the Raft core: entries, hard state, messages, Ready, status.

Owns the vocabulary shared by the core, the shells (runtime, simulator) and the wire codec.
Everything here is an immutable value; nothing here does I/O or keeps time.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import cbor2


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


class EntryKind(enum.IntEnum):
    NORMAL = 0  # application data (broker messages and control entries)
    NOOP = 1  # appended by every new leader so it can commit its term (Raft 5.4.2, 8)
    CONFIG = 2  # a new membership (Membership.encode): in force once appended (dissertation 4.1)


@dataclass(frozen=True, slots=True)
class Membership:
    """Who is in a group: voters (elections and commits count them) and learners (they get
    the log, and count for nothing until promoted), with each member's peer address for the
    shell (``host:port``; the core does not read them)."""

    voters: tuple[str, ...]
    learners: tuple[str, ...] = ()
    addresses: tuple[tuple[str, str], ...] = ()
    # Voters and learners, as a set (every message a node steps is checked against it).
    member_set: frozenset[str] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "member_set", frozenset(self.voters + self.learners))

    @property
    def members(self) -> tuple[str, ...]:
        return self.voters + self.learners

    def address_of(self, node_id: str) -> str | None:
        return dict(self.addresses).get(node_id)

    def encode(self) -> bytes:
        return cbor2.dumps([1, list(self.voters), list(self.learners),
                            [list(a) for a in self.addresses]])

    @staticmethod
    def decode(data: bytes) -> Membership:
        """ValueError if ``data`` is not a membership this version writes."""
        try:
            version, voters, learners, addresses = cbor2.loads(data)
        except (cbor2.CBORDecodeError, ValueError, TypeError) as err:
            raise ValueError(f"not a membership: {err}") from err
        ids = [*voters, *learners]
        if (version != 1 or not all(type(v) is str and v for v in ids)
                or len(set(ids)) != len(ids)
                or not all(type(a) is list and len(a) == 2 and all(type(x) is str for x in a)
                           for a in addresses)):
            raise ValueError("malformed membership")
        return Membership(tuple(voters), tuple(learners),
                          tuple((a, b) for a, b in addresses))


@dataclass(frozen=True, slots=True)
class Entry:
    index: int
    term: int
    kind: EntryKind
    data: bytes

    @property
    def size_bytes(self) -> int:
        return len(self.data) + ENTRY_OVERHEAD_BYTES


ENTRY_OVERHEAD_BYTES = 24  # what an entry counts for beyond its data, in the core's byte limits


def entries_bytes(entries: Sequence[Entry]) -> int:
    """The sum of the entries' size_bytes (one list comprehension, not a property per entry)."""
    return sum([len(e.data) for e in entries]) + ENTRY_OVERHEAD_BYTES * len(entries)


# Entry's generated __init__ (a frozen dataclass) costs ~0.4 us per call: for a 64-entry batch
# that was more than its CBOR decode. build_entries fills the slots directly through their
# descriptors, one C-level pass per column, for the batches of the commit path (a leader's
# proposals, a follower's decoded appends). Guarded: should Entry gain a field or a
# __post_init__, importing this module fails loudly instead of building half-made entries.
_ENTRY_FIELDS = ("index", "term", "kind", "data")
if tuple(f.name for f in dataclasses.fields(Entry)) != _ENTRY_FIELDS or hasattr(
    Entry, "__post_init__"
):
    raise RuntimeError("dledger.raft.types.build_entries must be updated for the new Entry layout")
_ENTRY_SLOT_SETTERS = tuple(getattr(Entry, name).__set__ for name in _ENTRY_FIELDS)


def build_entries(indexes: Sequence[int], terms: Iterable[int], kinds: Iterable[EntryKind],
                  datas: Iterable[bytes]) -> tuple[Entry, ...]:
    """Entries from columns of already valid values, as ``Entry(...)`` would build them (the
    columns as long as ``indexes``)."""
    entries = list(map(object.__new__, itertools.repeat(Entry, len(indexes))))
    for setter, column in zip(_ENTRY_SLOT_SETTERS, (indexes, terms, kinds, datas)):
        collections.deque(map(setter, entries, column), maxlen=0)
    return tuple(entries)


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before any reply that depends on it: term and vote."""

    term: int = 0
    voted_for: str | None = None


# --- messages ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VoteRequest:
    term: int
    src: str
    dst: str
    last_log_index: int
    last_log_term: int
    pre_vote: bool = False
    transfer: bool = False  # a leadership-transfer campaign: voters skip the leader-lease check


@dataclass(frozen=True, slots=True)
class VoteResponse:
    term: int
    src: str
    dst: str
    granted: bool
    pre_vote: bool = False


@dataclass(frozen=True, slots=True)
class AppendRequest:
    term: int
    src: str
    dst: str
    prev_log_index: int
    prev_log_term: int
    entries: tuple[Entry, ...]
    leader_commit: int


@dataclass(frozen=True, slots=True)
class AppendResponse:
    term: int
    src: str
    dst: str
    success: bool
    # success: the last index known to match the leader's log (prev_log_index + len(entries)).
    # failure: the prev_log_index that was rejected (lets the leader drop stale rejections).
    index: int
    # Fast back-tracking hints on failure (Raft thesis 5.3 / etcd): the follower's term at
    # prev_log_index (0 when its log is shorter) and the first index it holds of that term
    # (or its last_index + 1 when shorter).
    conflict_term: int = 0
    conflict_index: int = 0


@dataclass(frozen=True, slots=True)
class Heartbeat:
    term: int
    src: str
    dst: str
    # min(leader commit, follower match index): safe for the follower to commit up to.
    commit: int
    # The lowest index any member of the group still needs (retention never deletes it).
    retain_index: int = 0


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    term: int
    src: str
    dst: str
    # The heartbeat's commit index is past what an append of this leader's term has shown the
    # follower to hold (it restarted, or lost entries): the leader sends it an append.
    unverified: bool = False


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """What a snapshot covers: every entry up to ``index`` (of ``term``), applied, with the group's
    membership as of that index. The snapshot's data (the state machine's files, and whatever
    else the shell sends with them) is the shell's business; the core sees only this."""

    index: int
    term: int
    membership: Membership = Membership(())


@dataclass(frozen=True, slots=True)
class InstallSnapshot:
    """Leader -> follower whose next entry retention deleted (Raft section 7). On the leader's
    side the shell streams the snapshot's data instead of sending this as it is; the follower's
    shell steps its core with it once the whole snapshot is in (staged, checksummed). The answer
    is an ``AppendResponse`` for ``meta.index``."""

    term: int
    src: str
    dst: str
    meta: SnapshotMeta


@dataclass(frozen=True, slots=True)
class TimeoutNow:
    """Leadership transfer: the target campaigns at once, skipping pre-vote."""

    term: int
    src: str
    dst: str


Message = (VoteRequest | VoteResponse | AppendRequest | AppendResponse | Heartbeat
           | HeartbeatResponse | TimeoutNow | InstallSnapshot)


# --- output -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """One batch of work for the shell, in this order:

    1. send ``early_messages`` (leader appends and heartbeats: safe before local persistence,
       because the leader counts its own copy only after ``advance``);
    2. install ``snapshot`` (if not None: the staged snapshot of that index replaces the state
       machine and the whole log, durably), then persist ``hard_state`` (if not None) and
       ``entries`` (if ``entries[0].index`` is not past the stored last index, truncate the
       stored suffix from there first); fsync when ``must_sync`` in sync flush mode;
    3. send ``messages``;
    4. apply ``committed`` in order;
    5. call ``advance(ready)``.
    """

    hard_state: HardState | None
    entries: tuple[Entry, ...]
    early_messages: tuple[Message, ...]
    messages: tuple[Message, ...]
    committed: tuple[Entry, ...]
    must_sync: bool
    snapshot: SnapshotMeta | None = None


@dataclass(frozen=True, slots=True)
class FollowerStatus:
    node_id: str
    match_index: int
    next_index: int
    state: str  # "probe", "replicate" or "snapshot" (a snapshot is being sent to it)
    last_contact_ticks: int  # ticks since the last message from this follower (-1: never)
    in_flight: int


@dataclass(frozen=True, slots=True)
class Status:
    node_id: str
    role: Role
    term: int
    leader_id: str | None
    voted_for: str | None
    first_index: int
    last_index: int
    commit_index: int
    applied_index: int
    persisted_index: int
    retain_index: int
    transferee: str | None
    followers: tuple[FollowerStatus, ...] = field(default_factory=tuple)
    snapshot_index: int = 0  # the latest snapshot this node can send (0: none)
    voters: tuple[str, ...] = ()
    learners: tuple[str, ...] = ()
    config_index: int = 0  # the log index of the membership in force (0: the initial one)
    config_pending: bool = False  # that membership is not committed yet (a change in progress)


# --- seams --------------------------------------------------------------------------------


class LogReader(Protocol):
    """Read access to the durable (persisted) log, implemented by the shell's log store.

    The core reads older entries through it (to replicate to lagging followers, to apply after a
    restart). Indexes are 1-based; an empty log has first_index() == last_index() + 1.
    """

    def first_index(self) -> int: ...

    def last_index(self) -> int: ...

    def term_at(self, index: int) -> int:
        """Term of the entry at index; 0 for index 0 (before the log). Raises IndexError if the
        index is retained away or past the end."""
        ...

    def entries(self, lo: int, hi: int, max_bytes: int) -> Sequence[Entry]:
        """Entries [lo, hi), at least one if lo < hi, stopping before max_bytes is exceeded."""
        ...
