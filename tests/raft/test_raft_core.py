"""Scenario tests of the Raft core, each named after a claim of the Raft paper (Ongaro &
Ousterhout 2014; thesis 2014) or a rule of docs/design.md: leader election (5.2), log
replication (5.3) and committing entries of earlier terms (5.4.2, Figure 8)."""

from __future__ import annotations

import random

from dledger.raft.config import Canaries
from dledger.raft.types import (
    AppendRequest,
    AppendResponse,
    EntryKind,
    HardState,
    Role,
    VoteRequest,
    VoteResponse,
)
from tests.raft.raft_cluster import Cluster, preset_log


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


def test_replication_an_entry_commits_once_a_majority_stores_it() -> None:
    c = Cluster(3)
    c.elect("n1")
    c.crash("n3")
    _term, index = c.propose("n1", b"hello")
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
