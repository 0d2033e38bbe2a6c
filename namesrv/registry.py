"""The routing table: which nodes each broker group has, which one leads, and what topics it serves.

Owns the rules that turn registrations into routes. Pure: no I/O, no asyncio, no clock; every
method takes ``now_s`` (any monotonic seconds) from the caller, so tests drive time directly.

Leadership, per group, follows Raft's "at most one leader per term":
- the group remembers a fencing term and the node that led it (``term``, ``term_owner``); the
  routed ``leader`` is either that node or nobody;
- a leader claim at a higher term wins; at the same term only the node that already led that term
  may (re)claim it, unless it stepped down at that term; at a lower term it is refused and reported
  as stale. So a deposed leader, or a delayed registration from it, cannot win routing back while
  the claim that fenced it is alive. (A second node claiming an already-led term breaks Raft's
  guarantee; keeping the first claim avoids flip-flopping routes on it.)
- a non-leader registration from the term's leader at a term >= the fence means it stepped down:
  the group has no leader until a registration says otherwise;
- the fence lasts as long as the registration of the claim that set it: when the term's leader
  expires (or one lease after it unregistered) the fence falls back to the highest term the
  group's live nodes report, so one claim at an absurd term wedges a group for one lease at
  most, not forever. A deposed leader still cannot win back: the live nodes that deposed it
  report the higher term. The same node may reclaim its term when it registers again;
- every leader change is corroborated: a claim "N leads term T" that would change the routed
  leader is applied only once another live node of the group has registered that, at term T, it
  knows N as its leader (a follower learns its leader from the leader's first AppendEntries and
  registers at once). Until then the claim is pending: N is registered, not routed; the claim is
  applied when the confirming registration arrives, whichever comes first. The one exception is
  a group of one: no other live node registered, and the claim's member list names no other.
  So a node that wrongly believes it leads, or one forged claim, does not move the routes;
- a registration whose term jumps more than ``TERM_JUMP_MAX`` past every term the group's live
  nodes report is one the caller must have the group corroborate first (``term_to_verify``;
  the server shell asks the nodes' admin endpoints): a single request cannot invent a term;
- an unregister names the registration it removes (node id, term, and the registration's
  instance token if it had one); a mismatch is refused (``RegistrationMismatchError``).

A group's topics come from its leader's latest registration; without a leader, from the node
with the highest term (most recently seen on ties), so routes survive an election.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from namesrv.errors import RegistrationMismatchError, RegistryFullError
from namesrv.model import Registration, TopicRoute, Unregistration

__all__ = ["GroupView", "NodeView", "RegisterOutcome", "Registry", "TopicGroupRoute"]

LEASE_S_DEFAULT = 120.0
GROUPS_MAX_DEFAULT = 1024
NODES_PER_GROUP_MAX_DEFAULT = 16
# How far a registration's term may run ahead of the group's known terms without being checked
# against the group: elections with pre-vote raise the term by about one each, and brokers
# register at every term change, so a legitimate jump past this is rare (a NameServer that was
# away through many elections) and costs one round of status requests.
TERM_JUMP_MAX = 16


@dataclass(slots=True)
class _NodeRecord:
    registration: Registration
    last_seen_s: float


@dataclass(slots=True)
class _GroupState:
    name: str
    nodes: dict[str, _NodeRecord] = field(default_factory=dict)
    term: int = 0  # the fence: the highest term at which this group's leadership is known
    term_owner: str | None = None  # the node that led ``term`` (one leader per term), if known
    owner_stepped_down: bool = False  # term_owner gave up ``term``: nobody may lead it again
    leader: str | None = None  # the routed leader: term_owner or None
    owner_left_s: float | None = None  # when term_owner unregistered (the fence holds a lease)

    def check(self) -> None:
        assert self.leader is None or self.leader == self.term_owner, (self.leader, self.term_owner)
        assert not (self.owner_stepped_down and self.leader is not None)


@dataclass(frozen=True, slots=True)
class RegisterOutcome:
    """What a registering node learns: the group's leader as routed, and whether its own leader
    claim was refused (``stale``: a higher term, or another node, already leads) or waits for
    another member's confirmation (``pending``)."""

    group: str
    leader: str | None
    term: int
    stale: bool
    expires_in_s: float
    pending: bool = False
    first: bool = False  # the node was not registered (its first registration, or again)

    def to_json(self) -> dict[str, Any]:
        return {"ok": True, "expires_in_s": self.expires_in_s, "group": self.group,
                "leader": self.leader, "term": self.term, "stale": self.stale,
                "pending": self.pending}


@dataclass(frozen=True, slots=True)
class NodeView:
    node_id: str
    client_address: str
    admin_address: str
    role: str
    term: int
    last_seen_s_ago: float
    grpc_address: str = ""
    remoting_address: str = ""

    def to_json(self, with_admin: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"node_id": self.node_id, "client_address": self.client_address}
        if with_admin:
            out["admin_address"] = self.admin_address
        if self.grpc_address:
            out["grpc_address"] = self.grpc_address
        if self.remoting_address:
            out["remoting_address"] = self.remoting_address
        out.update(role=self.role, term=self.term, last_seen_s_ago=self.last_seen_s_ago)
        return out


@dataclass(frozen=True, slots=True)
class GroupView:
    """One group as the cluster view shows it: nodes by id, the routed leader, its topics."""

    group: str
    leader: str | None
    term: int
    nodes: tuple[NodeView, ...]
    topics: Mapping[str, TopicRoute]
    # the queues of a topic a first send creates there (0: none is created; None: not said)
    auto_create_queues: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "leader": self.leader, "term": self.term,
                "nodes": [n.to_json() for n in self.nodes],
                "topics": {name: self.topics[name].to_json() for name in sorted(self.topics)},
                "auto_create_queues": self.auto_create_queues}


@dataclass(frozen=True, slots=True)
class TopicGroupRoute:
    """One group serving a topic: where to send (leader, nodes) and its queues for that topic."""

    group: str
    leader: str | None
    term: int
    nodes: tuple[NodeView, ...]
    topic: TopicRoute

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"group": self.group, "leader": self.leader, "term": self.term,
                               "nodes": [n.to_json(with_admin=False) for n in self.nodes]}
        out.update(self.topic.to_json())
        return out


class Registry:
    """Registrations by group and node, with leases of ``lease_s`` and bounded sizes."""

    def __init__(self, lease_s: float = LEASE_S_DEFAULT, groups_max: int = GROUPS_MAX_DEFAULT,
                 nodes_per_group_max: int = NODES_PER_GROUP_MAX_DEFAULT) -> None:
        if lease_s <= 0 or groups_max < 1 or nodes_per_group_max < 1:
            raise ValueError("lease_s, groups_max and nodes_per_group_max must be positive")
        self.lease_s = lease_s
        self.groups_max = groups_max
        self.nodes_per_group_max = nodes_per_group_max
        self._groups: dict[str, _GroupState] = {}

    # -- changes ------------------------------------------------------------------------------

    def register(self, reg: Registration, now_s: float) -> RegisterOutcome:
        """Record (or refresh) a node's registration and apply its leadership claim, if any."""
        group = self._group_for_write(reg.group)
        record = group.nodes.get(reg.node_id)
        if record is None and len(group.nodes) >= self.nodes_per_group_max:
            raise RegistryFullError(f"group {reg.group!r} already has "
                                    f"{self.nodes_per_group_max} nodes")
        if record is None:
            group.nodes[reg.node_id] = _NodeRecord(reg, now_s)
        else:
            record.last_seen_s = max(record.last_seen_s, now_s)
            if reg.term >= record.registration.term:  # a delayed older registration: liveness only
                record.registration = reg
        stale = self._apply_claim(group, reg)
        self._settle_claims(group, now_s)
        group.check()
        pending = reg.claims_leadership and not stale and (group.leader, group.term) != (
            reg.node_id, reg.term)
        return RegisterOutcome(group.name, group.leader, group.term, stale, self.lease_s,
                               pending, first=record is None)

    def unregister(self, u: Unregistration, now_s: float) -> bool:
        """Remove a node (a clean shutdown); a leader leaving gives up its term. True if it was
        registered; ``RegistrationMismatchError`` if its registration is not the one named."""
        group = self._groups.get(u.group)
        record = group.nodes.get(u.node_id) if group is not None else None
        if group is None or record is None:
            return False
        reg = record.registration
        if reg.term != u.term or reg.instance != u.instance:
            raise RegistrationMismatchError(
                f"{u.group}/{u.node_id} is registered at term {reg.term}"
                f"{' with another instance' if reg.instance != u.instance else ''}: the "
                f"unregister names term {u.term}; not removed")
        del group.nodes[u.node_id]
        if u.node_id == group.term_owner:
            group.leader = None
            group.owner_stepped_down = True
            group.owner_left_s = now_s
        group.check()
        return True

    def expire(self, now_s: float) -> list[tuple[str, str]]:
        """Drop every registration not refreshed within the lease; return the (group, node) gone.
        An expired leader leaves its group leaderless, and its fence falls back to the terms
        the live nodes report."""
        gone: list[tuple[str, str]] = []
        for group in self._groups.values():
            late = [node_id for node_id, rec in group.nodes.items()
                    if now_s - rec.last_seen_s > self.lease_s]
            for node_id in late:
                del group.nodes[node_id]
                if node_id == group.leader:
                    group.leader = None
                gone.append((group.name, node_id))
            self._bound_fence(group, now_s)
        return gone

    def _bound_fence(self, group: _GroupState, now_s: float) -> None:
        """Without a live claim behind it, the fence is no higher than the live nodes report."""
        if group.term_owner in group.nodes or (
                group.owner_left_s is not None and now_s - group.owner_left_s <= self.lease_s):
            return  # the claim is alive (or left within a lease: a delayed claim stays fenced)
        live_max = max((rec.registration.term for rec in group.nodes.values()), default=0)
        if group.term_owner is not None or group.term > live_max:
            _release_fence(group)

    def term_to_verify(self, reg: Registration, now_s: float) -> int | None:
        """The group's known term (the highest its live nodes report) when ``reg``'s term jumps
        more than ``TERM_JUMP_MAX`` past it: the caller must have the group corroborate the term
        before ``register``. None when no check is needed, also for a group with no live node
        (nothing to compare with, and nothing to wedge)."""
        group = self._groups.get(reg.group)
        terms = [rec.registration.term for rec in group.nodes.values()
                 if now_s - rec.last_seen_s <= self.lease_s] if group is not None else []
        if not terms:
            return None
        known = max(terms)
        return known if reg.term > known + TERM_JUMP_MAX else None

    def admin_addresses(self, group_name: str, now_s: float) -> dict[str, str]:
        """node id -> admin address of every live node of a group (whom to ask about a term)."""
        group = self._groups.get(group_name)
        if group is None:
            return {}
        return {node_id: rec.registration.admin_address for node_id, rec in group.nodes.items()
                if now_s - rec.last_seen_s <= self.lease_s}

    def _group_for_write(self, name: str) -> _GroupState:
        group = self._groups.get(name)
        if group is not None:
            return group
        if len(self._groups) >= self.groups_max:
            tombstone = next((g.name for g in self._groups.values() if not g.nodes), None)
            if tombstone is None:
                raise RegistryFullError(f"already {self.groups_max} groups registered")
            del self._groups[tombstone]  # oldest empty group first: dicts keep insertion order
        group = self._groups[name] = _GroupState(name)
        return group

    def _apply_claim(self, group: _GroupState, reg: Registration) -> bool:
        """Update the group's leadership from one registration; True if a leader claim is stale
        (a claim the fence allows waits for ``_settle_claims``)."""
        if reg.claims_leadership:
            return not _fence_allows(group, reg.node_id, reg.term)
        if reg.node_id == group.term_owner and reg.term >= group.term:
            _step_down(group, reg.term)
        return False

    def _settle_claims(self, group: _GroupState, now_s: float) -> None:
        """Apply every live leader claim the fence allows and the group corroborates, lowest
        term first (the highest wins); the routed leader's own claim again is no change."""
        live = {node_id: rec.registration for node_id, rec in group.nodes.items()
                if now_s - rec.last_seen_s <= self.lease_s}
        claims = sorted((r for r in live.values() if r.claims_leadership),
                        key=lambda r: (r.term, r.node_id))
        for claim in claims:
            if (claim.term, claim.node_id) == (group.term, group.leader):
                continue  # routed already
            if _fence_allows(group, claim.node_id, claim.term) and _corroborated(claim, live):
                _claim_leadership(group, claim.node_id, claim.term)

    # -- views --------------------------------------------------------------------------------

    def leader_of(self, group_name: str) -> tuple[str | None, int] | None:
        """(routed leader, fencing term) of a group, or None if the group was never seen."""
        group = self._groups.get(group_name)
        return None if group is None else (group.leader, group.term)

    def route(self, topic: str, now_s: float) -> list[TopicGroupRoute]:
        """Every live group serving ``topic``, by group name; empty if none does."""
        routes = []
        for group in self._live_groups():
            cfg = _effective_topics(group).get(topic)
            if cfg is not None:
                routes.append(TopicGroupRoute(group.name, group.leader, group.term,
                                              _node_views(group, now_s), cfg))
        return routes

    def cluster(self, now_s: float) -> list[GroupView]:
        """Every live group with its nodes, leader and topics, by group name."""
        views = []
        for g in self._live_groups():
            reg = _effective_registration(g)
            views.append(GroupView(g.name, g.leader, g.term, _node_views(g, now_s),
                                   reg.topics if reg is not None else {},
                                   reg.auto_create_queues if reg is not None else None))
        return views

    def topics(self) -> list[str]:
        """Every topic some live group serves, sorted."""
        names: set[str] = set()
        for group in self._live_groups():
            names.update(_effective_topics(group))
        return sorted(names)

    def live_group_count(self) -> int:
        return sum(1 for g in self._groups.values() if g.nodes)

    def _live_groups(self) -> list[_GroupState]:
        return [self._groups[name] for name in sorted(self._groups) if self._groups[name].nodes]


def _fence_allows(group: _GroupState, node_id: str, term: int) -> bool:
    """Whether "node_id leads term" passes the fence (it may still wait for corroboration)."""
    if term < group.term:
        return False  # fenced: a higher term is already known
    return not (term == group.term and group.term_owner is not None
                and (group.term_owner != node_id or group.owner_stepped_down))
    # (else: the term already has, or had, its one leader)


def _corroborated(claim: Registration, live: Mapping[str, Registration]) -> bool:
    """Another live node says it follows ``claim``'s node at ``claim``'s term; or the group
    is the claimant alone (no other node live, and its member list names no other)."""
    others = [r for node_id, r in live.items() if node_id != claim.node_id]
    if any(r.term == claim.term and r.leader == claim.node_id for r in others):
        return True
    return not others and set(claim.members) <= {claim.node_id}


def _claim_leadership(group: _GroupState, node_id: str, term: int) -> bool:
    """Apply "node_id leads term" if the fence allows it; False if refused."""
    if not _fence_allows(group, node_id, term):
        return False
    group.term, group.term_owner, group.leader = term, node_id, node_id
    group.owner_stepped_down, group.owner_left_s = False, None
    return True


def _release_fence(group: _GroupState) -> None:
    """The claim that set the fence ended: fall back to the highest term the live nodes report."""
    group.term = max((rec.registration.term for rec in group.nodes.values()), default=0)
    group.term_owner, group.leader, group.owner_stepped_down = None, None, False
    group.owner_left_s = None


def _step_down(group: _GroupState, term: int) -> None:
    """The term's leader reported a non-leader role at ``term`` (>= the fence)."""
    group.leader = None
    if term > group.term:  # a newer term nobody is known to lead yet
        group.term, group.term_owner, group.owner_stepped_down = term, None, False
        group.owner_left_s = None
    else:
        group.owner_stepped_down = True


def _effective_topics(group: _GroupState) -> Mapping[str, TopicRoute]:
    reg = _effective_registration(group)
    return reg.topics if reg is not None else {}


def _effective_registration(group: _GroupState) -> Registration | None:
    """What the group's views take its topics and settings from: its leader's registration,
    else its freshest node's."""
    if group.leader is not None and group.leader in group.nodes:
        return group.nodes[group.leader].registration
    if not group.nodes:
        return None
    return max(group.nodes.values(), key=lambda r: (r.registration.term, r.last_seen_s)).registration


def _node_views(group: _GroupState, now_s: float) -> tuple[NodeView, ...]:
    """The group's registered nodes, but those its leader's membership no longer names (a
    removed node that still runs and registers is not routed to)."""
    views = []
    leader = group.nodes.get(group.leader) if group.leader is not None else None
    members = leader.registration.members if leader is not None else ()
    for node_id in sorted(group.nodes):
        if members and node_id not in members:
            continue
        rec = group.nodes[node_id]
        reg = rec.registration
        views.append(NodeView(node_id, reg.client_address, reg.admin_address, reg.role, reg.term,
                              round(max(0.0, now_s - rec.last_seen_s), 3), reg.grpc_address,
                              reg.remoting_address))
    return tuple(views)
