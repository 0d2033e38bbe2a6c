"""Membership changes in the Raft core (single-server changes with learners, dissertation 4.1),
scenario by scenario: a learner gets the log and counts for nothing; the change rules refuse by
name; a group grows 3 -> 4 -> 5 and shrinks back, committing with the right majorities; a
leader that removes itself steps down once that commits; a cut membership entry is undone; a
node behind on changes still votes and follows; a joining node waits for the log; a node that
lost its disk does not vote until it has caught up. The simulator sweeps the same under faults
(tests/raft/test_sim.py), with the canaries membership_two_at_once and membership_count_removed."""

from __future__ import annotations

import pytest

from dledger.raft.config import RaftConfig
from dledger.raft.types import (
    AppendRequest,
    Entry,
    EntryKind,
    Heartbeat,
    HeartbeatResponse,
    Membership,
    Role,
    VoteRequest,
    VoteResponse,
)
from protocol.errors import MembershipChangeError
from tests.raft import raft_cluster
from tests.raft.raft_cluster import Cluster


def _grow(c: Cluster, extra: list[str]) -> None:
    """Add nodes that join (no membership until the log brings one) to the cluster."""
    for k, nid in enumerate(extra):
        cfg = RaftConfig(node_id=nid, voters=tuple(c.ids), join=True)
        c.nodes[nid] = raft_cluster.TestNode(nid, cfg, seed=900 + k)
    c.ids += extra


def _change(c: Cluster, leader: str, voters: tuple[str, ...], learners: tuple[str, ...] = ()) -> int:
    _, index = c.core(leader).propose_membership(Membership(voters, learners))
    c.deliver()
    c.tick(2)
    return index


def test_a_learner_gets_the_log_and_counts_for_nothing() -> None:
    c = Cluster(3)
    _grow(c, ["n4"])
    c.elect("n1")
    _change(c, "n1", ("n1", "n2", "n3"), ("n4",))
    c.propose("n1", b"x")
    c.tick(2)
    leader, learner = c.core("n1"), c.core("n4")
    assert learner.membership.learners == ("n4",)
    assert learner.log.last_index() == leader.log.last_index()
    assert learner.log.commit_index == leader.log.commit_index
    c.isolate("n2")
    c.isolate("n3")
    c.cut -= {("n1", "n4"), ("n4", "n1")}
    before = leader.log.commit_index
    leader.propose(b"needs a voter")
    c.deliver()
    assert leader.log.commit_index == before  # the learner's copy does not make a quorum
    for _ in range(60):
        learner.tick()
    assert learner.role is Role.FOLLOWER  # it never campaigns


def test_the_change_rules_are_refused_by_name() -> None:
    c = Cluster(3, lazy_batch_entries=2)
    _grow(c, ["n4", "n5"])
    c.elect("n1")
    leader = c.core("n1")
    with pytest.raises(MembershipChangeError, match="as a learner before it votes"):
        leader.propose_membership(Membership(("n1", "n2", "n3", "n4")))
    with pytest.raises(MembershipChangeError, match="one voter at a time"):
        leader.propose_membership(Membership(("n1",)))
    leader.propose_membership(Membership(("n1", "n2", "n3"), ("n4", "n5")))
    with pytest.raises(MembershipChangeError, match="not committed yet"):
        leader.propose_membership(Membership(("n1", "n2", "n3"), ("n4",)))
    c.deliver()
    c.isolate("n5")
    c.tick(2)
    for k in range(4):
        c.propose("n1", b"more %d" % k)
    with pytest.raises(MembershipChangeError, match="learner n5 has not caught up"):
        leader.propose_membership(Membership(("n1", "n2", "n3", "n5"), ("n4",)))
    with pytest.raises(MembershipChangeError, match="no member twice"):
        leader.propose_membership(Membership(("n1", "n2", "n3"), ("n3",)))


def test_a_new_leader_changes_nothing_before_its_term_commits() -> None:
    c = Cluster(3)
    _grow(c, ["n4"])
    c.elect("n1")
    c.isolate("n1")
    votes_only = (lambda m: isinstance(m, (VoteRequest, VoteResponse)))  # noqa: E731
    for _ in range(60):  # n2 and n3 elect one of them; its no-op reaches no one
        for nid in ("n2", "n3"):
            c.core(nid).tick()
        c.deliver(votes_only)
        if c.core("n2").role is Role.LEADER or c.core("n3").role is Role.LEADER:
            break
    leader = c.core("n2") if c.core("n2").role is Role.LEADER else c.core("n3")
    assert leader.log.commit_index < leader.term_start_index
    with pytest.raises(MembershipChangeError, match="committed an entry of its term"):
        leader.propose_membership(Membership(("n1", "n2", "n3"), ("n4",)))


def test_a_group_grows_from_three_to_five_and_shrinks_back() -> None:
    c = Cluster(3)
    _grow(c, ["n4", "n5"])
    c.elect("n1")
    _change(c, "n1", ("n1", "n2", "n3"), ("n4", "n5"))
    _change(c, "n1", ("n1", "n2", "n3", "n4"), ("n5",))
    _change(c, "n1", ("n1", "n2", "n3", "n4", "n5"))
    for nid in c.ids:
        assert c.core(nid).voters == ("n1", "n2", "n3", "n4", "n5"), nid
    leader = c.core("n1")
    c.isolate("n2")
    c.isolate("n3")  # 3 of 5 left: n1, n4, n5 commit
    c.cut -= {(a, b) for a in ("n1", "n4", "n5") for b in ("n1", "n4", "n5")}
    before = leader.log.commit_index
    c.propose("n1", b"three of five")
    assert leader.log.commit_index == before + 1
    c.heal()
    _change(c, "n1", ("n1", "n2", "n3", "n4"))
    _change(c, "n1", ("n1", "n2", "n3"))
    for nid in ("n1", "n2", "n3"):
        assert c.core(nid).voters == ("n1", "n2", "n3")
    term = leader.term
    c.tick(60)  # the removed nodes are sent nothing more; their campaigns disrupt nothing
    assert c.leaders() == ["n1"] and leader.term == term
    c.propose("n1", b"three again")


def test_a_leader_that_removes_itself_steps_down_once_that_commits() -> None:
    c = Cluster(3)
    c.elect("n1")
    index = _change(c, "n1", ("n2", "n3"))
    old = c.core("n1")
    assert old.log.commit_index >= index and old.role is Role.FOLLOWER
    c.tick(40)
    leaders = c.leaders()
    assert len(leaders) == 1 and leaders[0] in ("n2", "n3")
    c.propose(leaders[0], b"after")  # commits with n2 and n3 alone


def test_a_cut_membership_entry_is_undone() -> None:
    c = Cluster(3)
    _grow(c, ["n4"])
    c.elect("n1")
    follower = c.core("n2")
    # an uncommitted membership from a leader of a later term reaches n2 only ...
    entry = Entry(follower.log.last_index() + 1, follower.term,
                  EntryKind.CONFIG, Membership(("n1", "n2", "n3"), ("n4",)).encode())
    follower.step(AppendRequest(follower.term, "n1", "n2", entry.index - 1,
                                follower.log.last_term(), (entry,), follower.log.commit_index))
    assert follower.membership.learners == ("n4",)
    # ... and a leader of a later term replaces it with an entry of its own
    other = Entry(entry.index, follower.term + 1, EntryKind.NORMAL, b"other")
    follower.step(AppendRequest(follower.term + 1, "n3", "n2", entry.index - 1,
                                follower.log.term_at(entry.index - 1), (other,),
                                follower.log.commit_index))
    assert follower.membership == Membership(("n1", "n2", "n3"))


def test_a_node_behind_on_changes_votes_for_a_candidate_it_does_not_know() -> None:
    c = Cluster(3)
    _grow(c, ["n4"])
    c.elect("n1")
    _change(c, "n1", ("n1", "n2", "n3"), ("n4",))
    stale = c.core("n2")
    before = stale.term
    stale.step(VoteRequest(before + 1, "n9", "n2", 10**6, 10**6))  # not a member anywhere
    assert stale.term == before  # in the leader's lease: ignored, however up to date
    for _ in range(30):
        stale.tick()  # the lease runs out (no leader heard)
    stale.step(VoteRequest(stale.term + 1, "n9", "n2", 10**6, 10**6))
    assert stale.voted_for == "n9"


def test_a_joining_node_waits_for_the_log_and_then_follows() -> None:
    c = Cluster(3)
    _grow(c, ["n4"])
    joiner = c.core("n4")
    assert joiner.membership.voters == ()
    for _ in range(60):
        joiner.tick()
    assert joiner.role is Role.FOLLOWER and joiner.term == 0
    c.elect("n1")
    _change(c, "n1", ("n1", "n2", "n3"), ("n4",))
    assert c.core("n4").membership.learners == ("n4",)
    assert c.core("n4").leader_id == "n1"


def test_a_node_that_lost_its_disk_votes_only_once_caught_up() -> None:
    c = Cluster(3)
    c.elect("n1")
    c.propose("n1", b"x")
    node = c.nodes["n3"]
    node.store.__init__()  # (a new, empty disk)
    node.hard_state.__init__()
    node.applied = []
    node.core = type(node.core)(node.config, node.store, node.hard_state.load(),
                                __import__("random").Random(1), recovering=True)
    wiped = node.core
    wiped.step(VoteRequest(5, "n2", "n3", 1, 1))
    assert wiped.voted_for is None  # its empty log would have granted it
    c.tick(40)  # (its term 5 made the others elect anew)
    leader = c.leaders()[0]
    c.propose(leader, b"y")
    assert not wiped.recovering and wiped.log.last_term() == c.core(leader).term


# -- a node that lost its disk (found in review: each of these failed before its fix) -----------


def _wipe(c: Cluster, nid: str) -> None:
    """The node restarts on an empty disk, recovering (as a node finding no term and vote)."""
    import random as _random

    from dledger.storage.memstore import MemoryHardStateStore, MemoryLogStore
    node = c.nodes[nid]
    node.store, node.hard_state, node.applied = MemoryLogStore(), MemoryHardStateStore(), []
    node.core = type(node.core)(node.config, node.store, node.hard_state.load(),
                                _random.Random(7), recovering=True)


def test_a_wiped_node_votes_again_only_once_it_holds_what_its_leader_committed() -> None:
    c = Cluster(3, max_append_entries=2)
    c.elect("n1")
    for k in range(3):
        c.propose("n1", b"a%d" % k)
    c.cut |= {("n1", "n2"), ("n2", "n1")}  # n2 falls behind; n1 commits with n3
    for k in range(6):
        c.propose("n1", b"b%d" % k)
    committed = c.core("n1").log.commit_index
    _wipe(c, "n3")
    c.core("n1").propose(b"c")
    for _ in range(200):  # one message at a time: n3 is repaired two entries per append
        c.drain_all()
        if not c.network:
            break
        m = c.network.pop(0)
        if (m.src, m.dst) not in c.cut:
            c.nodes[m.dst].core.step(m)
        if c.core("n3").log.last_index() >= 2:
            break
    assert c.core("n3").recovering  # it holds entries of its leader's term, not its commits
    c.network.clear()
    c.isolate("n1")
    for _ in range(60):
        c.tick(1, nodes=["n2", "n3"])
    n2 = c.core("n2")
    assert not (n2.role is Role.LEADER and n2.log.last_index() < committed)


def test_a_heartbeat_does_not_commit_what_no_append_of_its_leader_showed() -> None:
    c = Cluster(3)
    c.elect("n1")
    c.propose("n1", b"a")
    c.isolate("n1")
    c.core("n1").propose(b"stale-1")
    c.core("n1").propose(b"stale-2")
    c.deliver()
    for _ in range(60):
        c.tick(1, nodes=["n2", "n3"])
        if c.core("n2").role is Role.LEADER or c.core("n3").role is Role.LEADER:
            break
    leader = "n2" if c.core("n2").role is Role.LEADER else "n3"
    other = "n3" if leader == "n2" else "n2"
    for k in range(3):
        c.propose(leader, b"new%d" % k)
    new = c.core(leader)
    _wipe(c, other)
    stale = c.core("n1")  # the old leader's probe alone reaches the wiped node
    c.core(other).step(AppendRequest(1, "n1", other, 0, 0, tuple(stale.log.slice(1, 5, 1 << 20)), 2))
    c.drain_all()
    c.network.clear()
    wiped = c.core(other)
    wiped.step(Heartbeat(new.term, leader, other,
                         min(new.log.commit_index, new.progress[other].match_index)))
    c.drain_all()
    assert not any(e.data.startswith(b"stale") for e in c.nodes[other].applied)
    assert any(isinstance(m, HeartbeatResponse) and m.unverified for m in c.network)


def test_an_idle_leader_repairs_a_follower_that_lost_its_disk() -> None:
    c = Cluster(3)
    c.elect("n1")
    for k in range(5):
        c.propose("n1", b"x%d" % k)
    _wipe(c, "n3")
    c.tick(20)  # no proposal: heartbeats alone must bring the repair
    leader, wiped = c.core("n1"), c.core("n3")
    assert wiped.log.last_index() == leader.log.last_index()
    assert wiped.log.commit_index == leader.log.commit_index and not wiped.recovering
