"""Scenario tests of quorum-first replication (an option): a new entry goes at once only to the
followers a commit needs, the others in batches, and a silent eager follower is passed over."""

from __future__ import annotations

from dledger.raft.types import (
    AppendRequest,
)
from tests.raft.raft_cluster import Cluster


def test_quorum_first_a_new_entry_goes_at_once_only_to_the_followers_a_commit_needs() -> None:
    c = Cluster(3, quorum_first=True, lazy_batch_entries=4)
    c.elect("n1")
    c.tick()  # the first heartbeat picks: n2 and n3 are level, so n2 (by name) stays eager
    leader = c.core("n1")
    assert leader.lazy_peers == frozenset({"n3"})
    sent: list = []
    c.network, kept = [], c.network
    leader.propose(b"a")
    c.nodes["n1"].drain(sent)
    assert [m.dst for m in sent if isinstance(m, AppendRequest)] == ["n2"]
    for m in sent:
        c.core(m.dst).step(m)
    c.deliver()
    assert leader.log.commit_index == leader.log.last_index()  # n1 + n2 are a quorum
    assert c.core("n3").log.last_index() < leader.log.last_index()
    # a batch of lazy_batch_entries goes to the lazy follower without waiting for a heartbeat
    for k in range(3):
        c.propose("n1", f"b{k}".encode())
    assert c.core("n3").log.last_index() == leader.log.last_index()
    # and the heartbeat sends what is left
    c.propose("n1", b"c")
    assert c.core("n3").log.last_index() < leader.log.last_index()
    c.tick()
    assert c.core("n3").log.last_index() == leader.log.last_index()
    assert c.core("n3").log.commit_index == leader.log.commit_index
    c.network = kept + c.network


def _quorum_first_with_a_dead_eager_follower() -> tuple[Cluster, str, str]:
    """A 3-node quorum-first group whose eager follower took one more entry than the lazy one,
    then died. Returns (cluster, the dead one, the live one)."""
    c = Cluster(3, quorum_first=True)
    c.elect("n1")
    c.tick()
    leader = c.core("n1")
    eager = next(p for p in leader.progress if p not in leader.lazy_peers)
    other = next(p for p in leader.progress if p != eager)
    c.propose("n1", b"the eager one has it, the lazy one not yet")
    assert c.core(eager).log.last_index() > c.core(other).log.last_index()
    c.crash(eager)
    return c, eager, other


def test_quorum_first_a_proposal_that_only_a_dead_follower_got_commits_within_two_ticks() -> None:
    c, _eager, other = _quorum_first_with_a_dead_eager_follower()
    leader = c.core("n1")
    leader.propose(b"waits for the lazy one")
    c.deliver()
    assert leader.log.commit_index < leader.log.last_index()
    c.tick(2, nodes=["n1", other])
    assert leader.log.commit_index == leader.log.last_index()


def test_quorum_first_a_silent_eager_follower_is_passed_over_even_when_level() -> None:
    c, eager, other = _quorum_first_with_a_dead_eager_follower()
    leader = c.core("n1")
    c.tick(2, nodes=["n1", other])  # the heartbeats bring the lazy one level with the dead one
    assert leader.progress[other].match_index == leader.progress[eager].match_index
    assert leader.lazy_peers == frozenset({eager})
    c.propose("n1", b"next")
    assert leader.log.commit_index == leader.log.last_index()  # at once, through the new pick


def test_quorum_first_off_by_default_every_follower_gets_every_entry() -> None:
    c = Cluster(3)
    c.elect("n1")
    c.tick(3)
    assert c.core("n1").lazy_peers == frozenset()
    c.core("n1").propose(b"x")
    sent: list = []
    c.nodes["n1"].drain(sent)
    assert sorted(m.dst for m in sent if isinstance(m, AppendRequest)) == ["n2", "n3"]
