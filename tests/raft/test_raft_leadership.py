"""Scenario tests of the Raft core's leadership rules: pre-vote and check-quorum (a rejoining
node does not depose a healthy leader; an isolated leader steps down), leadership transfer and
the preferred leader, the commit index, proposals' bounds, and retention."""

from __future__ import annotations

import pytest

from dledger.raft.config import RaftConfig
from dledger.raft.types import (
    AppendRequest,
    Heartbeat,
    Role,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from protocol.errors import LeadershipTransferInProgressError, NotLeaderError, OverloadedError
from tests.raft.raft_cluster import Cluster


def test_prevote_a_partitioned_node_rejoining_does_not_depose_a_healthy_leader() -> None:
    c = Cluster(3, seed=5)
    c.elect("n1")
    term = c.core("n1").term
    c.isolate("n3")
    c.tick(200)
    assert c.core("n3").term == term  # pre-vote never reached a majority: the term did not move
    c.heal()
    c.tick(30)
    assert c.leaders() == ["n1"]
    assert c.core("n1").term == term


def test_check_quorum_leader_lease_ignores_disruptive_vote_requests() -> None:
    """Without pre-vote, a rejoining node has a higher term; voters that hear from a live leader
    ignore its vote requests (leader lease)."""
    c = Cluster(3, seed=5, pre_vote=False)
    c.elect("n1")
    c.tick(2)
    n2 = c.core("n2")
    n2.step(VoteRequest(term=n2.term + 5, src="n3", dst="n2", last_log_index=99, last_log_term=99))
    assert n2.term == c.core("n1").term and not n2.has_ready()


def test_check_quorum_an_isolated_leader_steps_down() -> None:
    c = Cluster(3, seed=2)
    c.elect("n1")
    c.isolate("n1")
    c.tick(25)
    assert c.core("n1").role is not Role.LEADER
    with pytest.raises(NotLeaderError):
        c.core("n1").propose(b"stale")
    others = [n for n in c.leaders() if n != "n1"]
    assert len(others) == 1


def test_check_quorum_a_stale_leader_learns_the_new_term_and_steps_down() -> None:
    c = Cluster(3, seed=2, check_quorum=False)
    c.elect("n1")
    c.isolate("n1")
    c.elect("n2")
    c.heal()
    c.tick(3)
    assert c.leaders() == ["n2"]


def test_leadership_transfer_catches_up_the_target_then_it_campaigns() -> None:
    c = Cluster(3)
    c.elect("n1")
    c.crash("n3")
    for k in range(5):
        c.propose("n1", f"m{k}".encode())
    c.restart("n3")  # n3 lags behind
    c.core("n1").transfer_leadership("n3")
    with pytest.raises(LeadershipTransferInProgressError):
        c.core("n1").propose(b"during")
    c.deliver()
    c.tick(3)
    assert c.leaders() == ["n3"]
    assert c.core("n3").log.last_index() >= 6


def test_leadership_transfer_aborts_when_the_target_is_unreachable() -> None:
    c = Cluster(3, seed=4)
    c.elect("n1")
    c.crash("n3")
    c.core("n1").transfer_leadership("n3")
    c.tick(25, nodes=["n1", "n2"])
    assert c.core("n1").role is Role.LEADER
    c.propose("n1", b"accepted again")


def test_preferred_leader_gets_leadership_when_it_is_healthy() -> None:
    c = Cluster(3, seed=9, preferred_leader="n3")
    c.elect("n1")
    c.tick(60)
    assert c.leaders() == ["n3"]


def test_commit_index_never_moves_backwards() -> None:
    c = Cluster(3)
    c.elect("n1")
    for k in range(4):
        c.propose("n1", f"x{k}".encode())
    c.tick(2)
    n2 = c.core("n2")
    high = n2.log.commit_index
    assert high >= 5
    n2.step(Heartbeat(term=n2.term, src="n1", dst="n2", commit=1))
    n2.step(AppendRequest(term=n2.term, src="n1", dst="n2", prev_log_index=high,
                          prev_log_term=n2.log.term_at(high), entries=(), leader_commit=0))
    assert n2.log.commit_index == high


def test_commit_index_is_learned_from_heartbeats() -> None:
    c = Cluster(3)
    c.elect("n1")
    _, index = c.core("n1").propose(b"y")
    c.deliver(lambda m: not isinstance(m, Heartbeat))
    assert c.core("n1").log.commit_index == index
    assert c.core("n3").log.commit_index < index  # appends carried the older commit index
    c.tick(2)
    assert c.core("n3").log.commit_index == index


def test_propose_on_a_follower_names_the_leader() -> None:
    c = Cluster(3)
    c.elect("n2")
    with pytest.raises(NotLeaderError) as err:
        c.core("n1").propose(b"x")
    assert err.value.leader_hint == "n2"


def test_propose_overloaded_when_uncommitted_bytes_exceed_the_bound() -> None:
    c = Cluster(3, max_uncommitted_bytes=1000)
    c.elect("n1")
    c.crash("n2")
    c.crash("n3")
    c.core("n1").propose(b"a" * 800)
    with pytest.raises(OverloadedError):
        c.core("n1").propose(b"b" * 800)


def test_pipelining_inflight_window_is_bounded() -> None:
    c = Cluster(3, max_inflight=4, max_append_entries=1)
    c.elect("n1")
    for k in range(20):
        c.core("n1").propose(f"p{k}".encode())
    rd = c.core("n1").ready()
    to_n2 = [m for m in rd.early_messages + rd.messages
             if isinstance(m, AppendRequest) and m.dst == "n2"]
    assert len(to_n2) == 4


def test_config_rejects_a_node_outside_the_group() -> None:
    with pytest.raises(ValueError):
        RaftConfig(node_id="x", voters=("a", "b"))


def test_retention_never_deletes_what_a_lagging_follower_still_needs() -> None:
    c = Cluster(3)
    c.elect("n1")
    c.crash("n3")  # n3 stays behind at the no-op
    for k in range(10):
        c.propose("n1", f"r{k}".encode())
    c.tick(2)
    n3_match = c.core("n1").progress["n3"].match_index
    assert c.core("n1").safe_retain_index() <= n3_match + 1
    # followers learn the group's floor from heartbeats and keep at least as much
    assert c.core("n2").safe_retain_index() <= n3_match + 1
    c.restart("n3")
    c.tick(3)
    assert c.core("n1").safe_retain_index() == c.core("n1").log.last_index() + 1


def test_prevote_a_stale_grant_from_an_earlier_round_does_not_count() -> None:
    c = Cluster(3)
    n1 = c.core("n1")
    n1.campaign()  # pre-vote round for term 1
    c.drain_all()
    c.network.clear()
    # n1 wins the pre-vote, campaigns at term 1, loses, and starts a new pre-vote round (term 2)
    n1.step(VoteResponse(term=1, src="n2", dst="n1", granted=True, pre_vote=True))
    n1.step(VoteResponse(term=1, src="n2", dst="n1", granted=False))
    n1.step(VoteResponse(term=1, src="n3", dst="n1", granted=False))
    n1.campaign()
    assert n1.role is Role.PRE_CANDIDATE and n1.term == 1
    # n3's grant from the first round (term 1 = our term now) arrives late
    n1.step(VoteResponse(term=1, src="n3", dst="n1", granted=True, pre_vote=True))
    assert n1.role is Role.PRE_CANDIDATE and n1.term == 1


def test_replication_repairs_a_follower_that_lost_acknowledged_entries() -> None:
    """An async-flush follower can lose acknowledged entries in a power loss; the leader must
    not keep probing at its old match index forever."""
    c = Cluster(3)
    c.elect("n1")
    for k in range(5):
        c.propose("n1", f"a{k}".encode())
    c.tick(2)
    n2 = c.nodes["n2"]
    held = n2.store.last_index()
    n2.store.entries_list = n2.store.entries_list[:2]  # the page cache is gone
    n2.store.positions = n2.store.positions[:2]
    n2.store.sync()
    c.restart("n2")
    c.propose("n1", b"after")
    c.tick(5)
    assert c.core("n2").log.last_index() == c.core("n1").log.last_index() > held


def test_preferred_leader_is_not_handed_leadership_while_it_lags() -> None:
    c = Cluster(3, seed=9, preferred_leader="n3", max_append_entries=1, max_inflight=1)
    c.elect("n1")
    c.crash("n3")
    for k in range(30):
        c.propose("n1", f"p{k}".encode())
    c.restart("n3")
    rejected = 0
    for k in range(12):  # proposals keep flowing while n3 catches up
        try:
            c.core("n1").propose(f"q{k}".encode())
        except LeadershipTransferInProgressError:
            rejected += 1
        c.tick(1)
    assert rejected <= 1
    c.tick(60)
    assert c.leaders() == ["n3"]


def test_leadership_transfer_resends_a_lost_timeout_now() -> None:
    c = Cluster(3, seed=3)
    c.elect("n1")
    c.tick(2)
    c.core("n1").transfer_leadership("n2")
    c.deliver(lambda m: not isinstance(m, TimeoutNow))  # the first TimeoutNow is lost
    c.network = [m for m in c.network if not isinstance(m, TimeoutNow)]
    c.tick(3)
    assert c.leaders() == ["n2"]
