"""Scenario tests of the Raft core, each named after a claim of the Raft paper (Ongaro & Ousterhout
2014; thesis 2014) or a rule of DESIGN.md section 1."""

from __future__ import annotations

import random

import pytest

from protocol.errors import LeadershipTransferInProgressError, NotLeaderError, OverloadedError
from dledger.raft.config import Canaries, RaftConfig
from dledger.raft.types import (
    AppendRequest,
    AppendResponse,
    EntryKind,
    HardState,
    Heartbeat,
    Role,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)

from tests.raft_cluster import Cluster, preset_log

# -- 5.2 leader election -------------------------------------------------------------------


def test_election_a_leader_emerges_by_timeout_and_wins_a_majority() -> None:
    c = Cluster(3, seed=7)
    c.tick(40)
    assert len(c.leaders()) == 1
    leader = c.leaders()[0]
    term = c.core(leader).term
    assert all(c.core(n).term == term for n in c.ids)
    assert all(c.core(n).leader_id == leader for n in c.ids)


def test_election_safety_at_most_one_leader_per_term_under_random_delivery() -> None:
    rng = random.Random(3)
    c = Cluster(5, seed=3)
    leaders_by_term: dict[int, set[str]] = {}
    for _ in range(400):
        for nid in c.ids:
            c.core(nid).tick()
        c.drain_all()
        rng.shuffle(c.network)
        keep = [m for m in c.network if rng.random() < 0.3]
        deliver = [m for m in c.network if m not in keep]
        c.network = keep
        for m in deliver:
            if rng.random() > 0.1:
                c.core(m.dst).step(m)
        for nid in c.ids:
            if c.core(nid).role is Role.LEADER:
                leaders_by_term.setdefault(c.core(nid).term, set()).add(nid)
    assert leaders_by_term, "no leader was ever elected"
    assert all(len(v) == 1 for v in leaders_by_term.values()), leaders_by_term


def test_election_no_leader_without_a_majority() -> None:
    c = Cluster(3, seed=1)
    c.crash("n2")
    c.crash("n3")
    c.tick(100)
    assert c.leaders() == []
    assert c.core("n1").term == 0  # pre-vote: a lone node never even raises its term


def test_election_a_group_of_one_elects_itself() -> None:
    c = Cluster(1)
    c.tick(30)
    assert c.leaders() == ["n1"]
    _, index = c.propose("n1", b"x")
    assert c.core("n1").log.commit_index == index


def test_election_restriction_a_stale_log_cannot_win() -> None:
    """5.4.1: a voter denies its vote to a candidate whose log is less up-to-date."""
    c = Cluster(3)
    preset_log(c.nodes["n1"], [1, 1], HardState(term=1))
    preset_log(c.nodes["n2"], [1, 1, 1], HardState(term=1))
    preset_log(c.nodes["n3"], [1, 1, 1], HardState(term=1))
    c.core("n1").campaign()
    c.deliver()
    assert c.core("n1").role is not Role.LEADER
    c.elect("n2")


def test_persist_vote_before_reply_hard_state_travels_with_the_vote() -> None:
    """The Ready that grants a vote carries the new hard state, and the grant is not an early
    message: the shell persists term and vote before the reply leaves."""
    c = Cluster(3, pre_vote=False)
    n2 = c.core("n2")
    n2.step(VoteRequest(term=1, src="n1", dst="n2", last_log_index=0, last_log_term=0))
    rd = n2.ready()
    assert rd.hard_state == HardState(term=1, voted_for="n1")
    assert rd.must_sync
    assert rd.early_messages == ()
    assert rd.messages == (VoteResponse(term=1, src="n2", dst="n1", granted=True),)
    n2.advance(rd)
    # one vote per term: a second candidate of the same term is refused
    n2.step(VoteRequest(term=1, src="n3", dst="n2", last_log_index=5, last_log_term=1))
    assert n2.ready().messages == (VoteResponse(term=1, src="n2", dst="n3", granted=False),)


# -- 5.3 log replication ---------------------------------------------------------------------


def test_replication_an_entry_commits_once_a_majority_stores_it() -> None:
    c = Cluster(3)
    c.elect("n1")
    c.crash("n3")
    term, index = c.propose("n1", b"hello")
    assert c.core("n1").log.commit_index == index
    c.tick(3)  # heartbeats carry the commit index to followers
    assert c.core("n2").log.commit_index == index
    assert [e.data for e in c.nodes["n2"].applied if e.kind is EntryKind.NORMAL] == [b"hello"]


def test_replication_no_commit_without_a_majority() -> None:
    c = Cluster(3, check_quorum=False)
    c.elect("n1")
    c.crash("n2")
    c.crash("n3")
    _, index = c.propose("n1", b"lonely")
    assert c.core("n1").log.commit_index < index


def test_replication_leader_counts_its_own_copy_only_after_it_is_durable() -> None:
    c = Cluster(3)
    c.elect("n1")
    c.crash("n3")
    leader = c.core("n1")
    _, index = leader.propose(b"x")
    rd = leader.ready()
    assert any(isinstance(m, AppendRequest) for m in rd.early_messages)
    # the follower acknowledges before the leader has persisted: one durable copy of three
    c.core("n2").step(next(m for m in rd.early_messages if m.dst == "n2"))
    ack = next(m for m in c.core("n2").ready().messages if isinstance(m, AppendResponse))
    # (stepping is not allowed between ready and advance: persist, then advance, then step)
    c.nodes["n1"].store.append(rd.entries)
    c.nodes["n1"].store.sync()
    leader.advance(rd)
    assert leader.log.commit_index < index
    leader.step(ack)
    assert leader.log.commit_index == index


def test_replication_one_append_per_follower_per_proposal_and_shared_entries() -> None:
    # has_ready() and ready() both look for appends to send: asked twice with nothing new in
    # between, the leader must not send twice. Followers in step get the same entries.
    c = Cluster(3)
    c.elect("n1")
    leader = c.core("n1")
    leader.propose(b"x")
    assert leader.has_ready() and leader.has_ready()
    rd = leader.ready()
    appends = [m for m in rd.early_messages if isinstance(m, AppendRequest)]
    assert sorted(m.dst for m in appends) == ["n2", "n3"]
    assert appends[0].entries is appends[1].entries
    assert [e.data for e in appends[0].entries] == [b"x"]


def test_log_matching_a_follower_with_a_divergent_tail_is_repaired() -> None:
    c = Cluster(3)
    preset_log(c.nodes["n1"], [1, 1, 3, 3], HardState(term=3))
    preset_log(c.nodes["n2"], [1, 1, 3], HardState(term=3))
    preset_log(c.nodes["n3"], [1, 1, 2, 2, 2, 2], HardState(term=2))
    c.elect("n1")
    c.propose("n1", b"after")
    c.tick(3)
    logs = {n: [(e.index, e.term) for e in c.nodes[n].store.entries_list] for n in c.ids}
    assert logs["n1"] == logs["n2"] == logs["n3"]
    assert [t for _, t in logs["n3"]][:4] == [1, 1, 3, 3]


def test_fast_backtracking_resolves_a_long_conflict_in_few_round_trips() -> None:
    """Conflict term and index let the leader skip a whole term per round trip, not one entry."""
    c = Cluster(3)
    preset_log(c.nodes["n1"], [1] * 5 + [4] * 200, HardState(term=4))
    preset_log(c.nodes["n2"], [1] * 5 + [4] * 200, HardState(term=4))
    preset_log(c.nodes["n3"], [1] * 5 + [2] * 150 + [3] * 150, HardState(term=3))
    c.crash("n2")
    c.elect("n1")
    rejections = []
    orig_step = c.core("n1").step

    def spy(m):
        if isinstance(m, AppendResponse) and not m.success:
            rejections.append(m)
        orig_step(m)

    c.core("n1").step = spy  # type: ignore[method-assign]
    c.tick(5)
    assert c.core("n3").log.last_index() == c.core("n1").log.last_index()
    assert len(rejections) <= 3, rejections


def test_stale_reordered_append_never_truncates_matched_entries() -> None:
    c = Cluster(3)
    c.elect("n1")
    c.crash("n3")
    for k in range(3):
        c.propose("n1", f"e{k}".encode())
    n2 = c.core("n2")
    before = n2.log.last_index()
    # an old append (prev 1, carrying only entry 2) arrives late
    old = c.nodes["n1"].store.entries_list[1:2]
    n2.step(AppendRequest(term=n2.term, src="n1", dst="n2", prev_log_index=1,
                          prev_log_term=c.nodes["n1"].store.entries_list[0].term,
                          entries=tuple(old), leader_commit=0))
    c.drain_all()
    assert n2.log.last_index() == before


# -- 5.4.2 committing entries from previous terms (Figure 8) -----------------------------------


def _figure8(canaries: Canaries) -> Cluster:
    """Figure 8 (c): S1 leads term 4 and replicates its term-2 entry at index 2 to a majority
    (S1, S2, S3) while its term-4 no-op at index 3 is held back."""
    c = Cluster(5, canaries=canaries, max_append_entries=1, check_quorum=False)
    preset_log(c.nodes["n1"], [1, 2], HardState(term=3))  # S1 restarted and saw term 3
    preset_log(c.nodes["n2"], [1], HardState(term=2, voted_for="n1"))
    preset_log(c.nodes["n3"], [1], HardState(term=3, voted_for="n5"))
    preset_log(c.nodes["n4"], [1], HardState(term=3, voted_for="n5"))
    preset_log(c.nodes["n5"], [1, 3], HardState(term=3, voted_for="n5"))
    c.crash("n5")
    c.core("n1").campaign()
    # Appends that would carry index 3 to a follower that already has index 2 are held back.
    c.deliver(lambda m: not isinstance(m, AppendRequest) or c.core(m.dst).log.last_index() < 2
              or all(e.index <= 2 for e in m.entries))
    return c


def test_figure8_previous_term_entry_is_not_committed_by_counting_replicas() -> None:
    c = _figure8(Canaries())
    n1 = c.core("n1")
    assert n1.role is Role.LEADER and n1.term == 4
    holders = [n for n in ("n1", "n2", "n3") if c.core(n).log.match_term(2, 2)]
    assert len(holders) == 3  # a majority of five stores (2, term 2) ...
    assert n1.log.commit_index < 2  # ... yet it is not committed until a term-4 entry is
    c.deliver()
    assert n1.log.commit_index == 3  # the no-op of term 4 commits, and index 2 with it


def test_figure8_canary_commit_previous_term_commits_too_early() -> None:
    c = _figure8(Canaries(commit_previous_term=True))
    assert c.core("n1").log.commit_index >= 2  # the seeded bug commits (2, term 2) by counting


# -- pre-vote and check-quorum -------------------------------------------------------------------


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


# -- leadership transfer --------------------------------------------------------------------


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


# -- commit index ------------------------------------------------------------------------------


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


# -- proposals ------------------------------------------------------------------------------------


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


# -- retention --------------------------------------------------------------------------------


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


# -- quorum-first replication (an option; DESIGN.md section 1 leaves the timing of appends to the
# leader) --------------------------------------------------------------------------------------


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
    c, eager, other = _quorum_first_with_a_dead_eager_follower()
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
