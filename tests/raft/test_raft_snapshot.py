"""Snapshots in the Raft core (Raft section 7), scenario by scenario: a follower behind the
leader's retention is sent the latest snapshot, installs it and follows the log from there; a
snapshot never takes committed state back; a follower that holds the snapshot's last entry keeps
its log; a failed transfer is retried at the pace of heartbeats; a node with a snapshot to install
does not campaign. The simulator (tests/raft/test_sim.py) sweeps the same under faults."""

from __future__ import annotations

import pytest

from dledger.raft.config import Canaries
from dledger.raft.progress import ProgressState
from dledger.raft.types import AppendResponse, InstallSnapshot, Membership, Role, SnapshotMeta
from tests.raft.raft_cluster import Cluster

VOTERS = Membership(("n1", "n2", "n3"))


def _tick_holding_snapshots(c: Cluster, times: int, held: list[InstallSnapshot]) -> None:
    """Tick every node and deliver all but InstallSnapshot messages, which go to ``held`` (the
    shell streams a snapshot's data before the follower's core sees one)."""
    for _ in range(times):
        for nid in c.ids:
            c.core(nid).tick()
        c.deliver(lambda m: not isinstance(m, InstallSnapshot))
        held.extend(m for m in c.network if isinstance(m, InstallSnapshot))
        c.network = [m for m in c.network if not isinstance(m, InstallSnapshot)]


def _leader_with_snapshot(c: Cluster, entries: int = 10) -> SnapshotMeta:
    """n1 leads, n3 is cut off while ``entries`` commit; n1 and n2 snapshot and retain them."""
    c.elect("n1")
    c.isolate("n3")
    for k in range(entries):
        c.propose("n1", f"v{k}".encode())
    c.tick(2)  # (a heartbeat brings n2 the last commit index)
    leader = c.core("n1")
    top = leader.log.applied_index
    meta = SnapshotMeta(top, leader.log.term_at(top), VOTERS)
    for nid in ("n1", "n2"):
        c.core(nid).snapshot_taken(meta)
        c.nodes[nid].store.retain_from(top + 1)
    assert leader.log.first_index() == top + 1
    return meta


def test_a_follower_behind_retention_installs_the_snapshot_then_follows_the_log() -> None:
    c = Cluster(3)
    meta = _leader_with_snapshot(c)
    sent: list[InstallSnapshot] = []
    applied_before = len(c.nodes["n3"].applied)
    c.heal()
    _tick_holding_snapshots(c, 3, sent)
    assert sent and sent[0].meta == meta and sent[0].dst == "n3"
    pr = c.core("n1").progress["n3"]
    assert pr.state is ProgressState.SNAPSHOT and pr.pending_snapshot == meta.index
    c.network.extend(sent[:1])  # the shell streamed the data; the follower's shell steps this
    c.deliver()
    c.core("n1").report_snapshot("n3", ok=True)
    c.propose("n1", b"after")
    c.tick(3)
    follower, leader = c.core("n3"), c.core("n1")
    assert c.nodes["n3"].installed == [meta]
    assert follower.log.commit_index == leader.log.commit_index == meta.index + 1
    # (its no-op, index 1, it may have applied on a heartbeat's commit before the snapshot)
    after = [e for e in c.nodes["n3"].applied[applied_before:] if e.index > 1]
    assert [(e.index, e.data) for e in after] == [(meta.index + 1, b"after")]
    assert leader.progress["n3"].state is ProgressState.REPLICATE
    assert follower.snapshot == meta  # it could send the snapshot on, were it to lead


def test_a_snapshot_at_or_below_the_commit_index_is_not_restored() -> None:
    c = Cluster(3)
    c.elect("n1")
    for k in range(5):
        c.propose("n1", f"v{k}".encode())
    follower = c.core("n2")
    commit = follower.log.commit_index
    follower.step(InstallSnapshot(follower.term, "n1", "n2", SnapshotMeta(3, 1, VOTERS)))
    rd = follower.ready()
    assert rd.snapshot is None and follower.log.commit_index == commit
    assert [m for m in rd.messages if isinstance(m, AppendResponse)] == [
        AppendResponse(follower.term, "n2", "n1", True, commit)]


def test_the_canary_restores_below_the_commit_index() -> None:
    c = Cluster(3, canaries=Canaries(snapshot_below_commit=True))
    c.elect("n1")
    for k in range(5):
        c.propose("n1", f"v{k}".encode())
    follower = c.core("n2")
    follower.step(InstallSnapshot(follower.term, "n1", "n2", SnapshotMeta(3, 1, VOTERS)))
    assert follower.ready().snapshot == SnapshotMeta(3, 1, VOTERS)
    assert follower.log.commit_index == 3  # committed state moved back: the simulator catches it


def test_a_follower_holding_the_snapshots_last_entry_keeps_its_log() -> None:
    c = Cluster(3)
    c.elect("n1")
    for k in range(5):
        c.propose("n1", f"v{k}".encode())
    c.isolate("n2")  # n2 gets the next entries, but not the commit index that covers them
    leader = c.core("n1")
    for k in range(3):
        leader.propose(f"w{k}".encode())
    c.drain_all()
    c.heal()
    c.deliver(lambda m: m.dst == "n2" and not isinstance(m, AppendResponse))
    follower = c.core("n2")
    last = follower.log.last_index()
    assert follower.log.commit_index < last
    meta = SnapshotMeta(last - 1, follower.log.term_at(last - 1), VOTERS)
    follower.step(InstallSnapshot(follower.term, "n1", "n2", meta))
    rd = follower.ready()
    assert rd.snapshot is None
    assert follower.log.commit_index == last - 1 and follower.log.last_index() == last


def test_a_failed_transfer_is_retried_once_a_heartbeat_is_answered() -> None:
    c = Cluster(3)
    _leader_with_snapshot(c)
    c.heal()
    sent: list[InstallSnapshot] = []
    _tick_holding_snapshots(c, 3, sent)
    assert len(sent) == 1
    leader = c.core("n1")
    leader.report_snapshot("n3", ok=False)
    _tick_holding_snapshots(c, 0, sent)
    assert len(sent) == 1  # not again at once: a failing link is not hammered
    assert leader.progress["n3"].state is ProgressState.PROBE
    _tick_holding_snapshots(c, 2, sent)
    assert len(sent) >= 2 and leader.progress["n3"].state is ProgressState.SNAPSHOT


def test_a_node_with_a_snapshot_to_install_does_not_campaign() -> None:
    c = Cluster(3)
    meta = _leader_with_snapshot(c)
    follower = c.core("n3")
    follower.step(InstallSnapshot(c.core("n1").term, "n1", "n3", meta))
    for _ in range(100):
        follower.tick()
    assert follower.role is Role.FOLLOWER and follower.log.pending_snapshot == meta
    follower.campaign()
    assert follower.role is Role.FOLLOWER
    rd = follower.ready()
    assert rd.snapshot == meta and rd.must_sync
    c.nodes["n3"].store.reset_to(meta.index, meta.term)
    follower.advance(rd)
    assert follower.log.pending_snapshot is None and follower.log.first_index() == meta.index + 1


def test_a_snapshot_past_the_applied_index_is_refused() -> None:
    c = Cluster(3)
    c.elect("n1")
    leader = c.core("n1")
    with pytest.raises(ValueError, match="past the applied index"):
        leader.snapshot_taken(SnapshotMeta(leader.log.applied_index + 1, leader.term, VOTERS))
