"""The NameServer's routing table, driven with an injected time: routes, leadership by term and
its fencing, step-down, leases, topics from the leader, several groups, bounds, and the purity of
the module (no I/O, no clock)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from namesrv.errors import RegistrationMismatchError, RegistryFullError
from namesrv.model import Registration, TopicRoute, Unregistration
from namesrv.registry import TERM_JUMP_MAX, Registry

ROOT = Path(__file__).resolve().parents[2]
RW4 = TopicRoute(4, 4, 6)
MEMBERS = ("n0", "n1", "n2")


def reg(node: str, role: str = "follower", term: int = 1, group: str = "a",
        topics: dict[str, TopicRoute] | None = None, port: int = 10911,
        leader: str | None = None, members: tuple[str, ...] | None = None) -> Registration:
    """A registration; a leader names itself as its term's leader, a follower none unless
    told (its word confirms another node's claim)."""
    claim = role == "leader"
    return Registration(group, node, f"127.0.0.1:{port}", f"127.0.0.1:{port + 10}", role, term,
                        {"orders": RW4} if topics is None else topics,
                        members=() if members is None else members,
                        leader=(node if claim else "") if leader is None else leader)


def leader_of(r: Registry, group: str = "a") -> tuple[str | None, int] | None:
    return r.leader_of(group)


def three_nodes(r: Registry, leader: str = "n0", term: int = 7, now_s: float = 0.0) -> None:
    """A group of three at ``term``: the followers name ``leader``, which claims it."""
    for i, node in enumerate(("n0", "n1", "n2")):
        role = "leader" if node == leader else "follower"
        r.register(reg(node, role, term, port=10911 + i, leader=leader, members=MEMBERS), now_s)


# -- register and route ------------------------------------------------------------------------

def test_register_then_route_shows_the_group_its_nodes_leader_and_queues() -> None:
    r = Registry()
    three_nodes(r, now_s=100.0)
    [route] = r.route("orders", now_s=102.5)
    assert route.to_json() == {
        "group": "a", "leader": "n0", "term": 7,
        "nodes": [
            {"node_id": f"n{i}", "client_address": f"127.0.0.1:{10911 + i}",
             "role": "leader" if i == 0 else "follower", "term": 7, "last_seen_s_ago": 2.5}
            for i in range(3)],
        "read_queues": 4, "write_queues": 4, "perm": 6}
    assert r.route("payments", now_s=102.5) == []
    assert r.topics() == ["orders"]


def test_register_returns_the_lease_and_the_routed_leader() -> None:
    r = Registry(lease_s=30.0)
    out = r.register(reg("n1", "follower", 3, leader="n0"), now_s=0.0)
    assert out.to_json() == {"ok": True, "expires_in_s": 30.0, "group": "a", "leader": None,
                             "term": 0, "stale": False, "pending": False}
    out = r.register(reg("n0", "leader", 3), now_s=0.0)
    assert (out.leader, out.term, out.stale) == ("n0", 3, False)


def test_cluster_view_lists_every_group_with_admin_addresses_and_topics() -> None:
    r = Registry()
    three_nodes(r)
    r.register(reg("m0", "leader", 2, group="b", topics={"pay": TopicRoute(8, 8, 4)}), 0.0)
    view = [g.to_json() for g in r.cluster(now_s=1.0)]
    assert [g["group"] for g in view] == ["a", "b"]
    assert view[1] == {"group": "b", "leader": "m0", "term": 2,
                       "nodes": [{"node_id": "m0", "client_address": "127.0.0.1:10911",
                                  "admin_address": "127.0.0.1:10921", "role": "leader",
                                  "term": 2, "last_seen_s_ago": 1.0}],
                       "topics": {"pay": {"read_queues": 8, "write_queues": 8, "perm": 4}},
                       "auto_create_queues": None}


# -- leadership by term and fencing ------------------------------------------------------------

def test_a_leader_claim_at_a_higher_term_replaces_the_leader_once_a_member_confirms_it() -> None:
    r = Registry()
    three_nodes(r, leader="n0", term=7)
    out = r.register(reg("n1", "leader", 8, members=MEMBERS), now_s=1.0)
    assert not out.stale and out.pending and leader_of(r) == ("n0", 7)  # its own word only
    r.register(reg("n0", "follower", 8), now_s=1.5)  # at term 8, no leader known yet
    assert leader_of(r) == (None, 8)  # (n0 stepped down: nobody routed)
    r.register(reg("n2", "follower", 8, leader="n1"), now_s=2.0)  # n2 follows n1
    assert leader_of(r) == ("n1", 8)
    assert not r.register(reg("n1", "leader", 8, members=MEMBERS), now_s=3.0).pending


def test_a_confirmation_that_arrives_first_lets_the_claim_through_at_once() -> None:
    r = Registry()
    three_nodes(r, leader="n0", term=7)
    r.register(reg("n2", "follower", 8, leader="n1"), now_s=1.0)
    out = r.register(reg("n1", "leader", 8, members=MEMBERS), now_s=1.5)
    assert (out.leader, out.term, out.pending) == ("n1", 8, False)


def test_a_claim_nobody_confirms_moves_nothing() -> None:
    r = Registry(lease_s=10.0)
    three_nodes(r, leader="n0", term=7)
    for claim in (reg("evil", "leader", 8), reg("n1", "leader", 8, members=MEMBERS),
                  reg("n2", "leader", 9, members=("n2",))):  # (a group of one: n0 and n1 live)
        out = r.register(claim, now_s=1.0)
        assert out.pending and not out.stale and leader_of(r) == ("n0", 7)
    r.register(reg("n0", "follower", 8, leader="n2"), now_s=2.0)  # a word for another term
    assert leader_of(r) == (None, 8)  # (n0 stepped down itself)
    assert [g.leader for g in r.cluster(2.0)] == [None]
    r.register(reg("n0", "follower", 9, leader="n2"), now_s=3.0)
    assert leader_of(r) == ("n2", 9)


def test_a_lone_claim_leads_a_group_of_one_only() -> None:
    r = Registry(lease_s=10.0)
    assert not r.register(reg("n0", "leader", 3, members=("n0",)), now_s=0.0).pending
    assert leader_of(r) == ("n0", 3)
    out = r.register(reg("x", "leader", 1, group="b", members=("x", "y")), now_s=0.0)
    assert out.pending and leader_of(r, "b") == (None, 0)  # y may be the one that leads


def test_a_lower_term_leader_claim_never_replaces_a_higher_term_leader_even_arriving_later() -> None:
    r = Registry()
    r.register(reg("n1", "leader", 8), now_s=0.0)
    out = r.register(reg("n0", "leader", 7), now_s=5.0)  # the deposed leader, still registering
    assert out.stale and (out.leader, out.term) == ("n1", 8)
    assert leader_of(r) == ("n1", 8)
    assert r.route("orders", 5.0)[0].leader == "n1"


def test_the_fence_holds_for_the_lease_of_the_claim_that_set_it() -> None:
    r = Registry(lease_s=10.0)
    r.register(reg("n0", "leader", 7), now_s=0.0)
    r.register(reg("n1", "leader", 8), now_s=1.0)
    r.register(reg("n2", "follower", 8, leader="n1"), now_s=1.0)
    r.register(reg("n0", "leader", 7), now_s=8.0)  # refused, but n0 is alive
    assert r.register(reg("n0", "leader", 7), now_s=11.0).stale  # n1's claim is still live
    assert r.expire(now_s=11.5) == [("a", "n1"), ("a", "n2")]
    assert leader_of(r) == (None, 7)  # the fence falls to what the live nodes report
    assert not r.register(reg("n0", "leader", 7), now_s=12.0).stale
    r.expire(now_s=30.0)
    assert r.cluster(30.0) == [] and r.route("orders", 30.0) == []
    assert not r.register(reg("n2", "leader", 9), now_s=31.0).stale


def test_a_deposed_leader_cannot_win_back_while_a_live_node_reports_the_higher_term() -> None:
    r = Registry(lease_s=10.0)
    three_nodes(r, leader="n0", term=7, now_s=0.0)
    r.register(reg("n1", "leader", 8), now_s=1.0)
    r.register(reg("n2", "follower", 8, leader="n1"), now_s=9.0)
    r.register(reg("n0", "leader", 7), now_s=9.0)
    assert r.expire(now_s=11.5) == [("a", "n1")]
    assert leader_of(r) == (None, 8)  # n2, live, reports term 8
    assert r.register(reg("n0", "leader", 7), now_s=12.0).stale


def test_an_absurd_claim_confirmed_by_a_lying_node_fences_only_for_its_own_lease() -> None:
    r = Registry(lease_s=10.0)
    three_nodes(r, leader="n0", term=7, now_s=0.0)
    r.register(reg("evil", "leader", 2**62), now_s=1.0)  # (the server shell refuses this one)
    r.register(reg("liar", "follower", 2**62, leader="evil"), now_s=1.0)
    for t in (2.0, 6.0, 10.0):  # the real group keeps registering; fenced while evil lives
        for node in ("n1", "n2"):
            r.register(reg(node, "follower", 7, leader="n0"), now_s=t)
        assert r.register(reg("n0", "leader", 7), now_s=t).stale
    assert r.expire(now_s=11.5) == [("a", "evil"), ("a", "liar")]
    assert not r.register(reg("n0", "leader", 7), now_s=12.0).stale
    assert leader_of(r) == ("n0", 7) and r.route("orders", 12.0)[0].leader == "n0"


def test_a_fence_left_without_an_owner_falls_when_no_live_node_reports_its_term() -> None:
    r = Registry(lease_s=10.0)
    three_nodes(r, leader="n0", term=7, now_s=0.0)
    r.register(reg("evil", "leader", 2**62), now_s=1.0)
    r.register(reg("liar", "follower", 2**62, leader="evil"), now_s=1.0)
    r.register(reg("evil", "follower", 2**62), now_s=2.0)  # "steps down": a fence nobody owns
    assert leader_of(r) == (None, 2**62)
    for node in ("n1", "n2"):
        r.register(reg(node, "follower", 7, leader="n0"), now_s=9.0)
    r.register(reg("n0", "leader", 7), now_s=9.0)
    r.expire(now_s=12.5)
    assert not r.register(reg("n0", "leader", 7), now_s=13.0).stale
    assert leader_of(r) == ("n0", 7)


def test_a_term_far_past_the_groups_terms_is_to_be_verified() -> None:
    r = Registry(lease_s=10.0)
    assert r.term_to_verify(reg("n0", "leader", 2**62), now_s=0.0) is None  # nothing known
    three_nodes(r, leader="n0", term=7, now_s=0.0)
    assert r.term_to_verify(reg("n1", "leader", 7 + TERM_JUMP_MAX), now_s=1.0) is None
    assert r.term_to_verify(reg("x", "follower", 8 + TERM_JUMP_MAX), now_s=1.0) == 7
    assert r.term_to_verify(reg("evil", "leader", 2**62), now_s=1.0) == 7
    assert r.admin_addresses("a", now_s=1.0) == {f"n{i}": f"127.0.0.1:{10921 + i}"
                                                 for i in range(3)}
    r.register(reg("n1", "follower", 100), now_s=2.0)  # as the shell does once corroborated
    assert r.term_to_verify(reg("n2", "leader", 101), now_s=3.0) is None
    assert r.term_to_verify(reg("n2", "leader", 2**62), now_s=20.0) is None  # all expired
    assert r.admin_addresses("a", now_s=20.0) == {} and r.admin_addresses("zz", 0.0) == {}


def test_a_second_node_claiming_an_already_led_term_is_refused() -> None:
    r = Registry()
    r.register(reg("n0", "leader", 7), now_s=0.0)
    assert r.register(reg("n1", "leader", 7), now_s=1.0).stale
    assert leader_of(r) == ("n0", 7)


def test_the_leader_refreshing_its_claim_keeps_it() -> None:
    r = Registry()
    r.register(reg("n0", "leader", 7), now_s=0.0)
    assert not r.register(reg("n0", "leader", 7), now_s=30.0).stale
    assert leader_of(r) == ("n0", 7)


# -- step-down ---------------------------------------------------------------------------------

def test_a_follower_registration_from_the_leader_at_a_higher_term_clears_the_leader() -> None:
    r = Registry()
    three_nodes(r, leader="n0", term=7)
    r.register(reg("n0", "follower", 8), now_s=1.0)
    assert leader_of(r) == (None, 8)
    assert r.register(reg("n0", "leader", 7), now_s=2.0).stale  # a delayed old claim
    assert not r.register(reg("n2", "leader", 8), now_s=3.0).stale  # the term's winner
    r.register(reg("n1", "follower", 8, leader="n2"), now_s=3.0)
    assert leader_of(r) == ("n2", 8)


def test_stepping_down_within_a_term_closes_that_term() -> None:
    r = Registry()
    r.register(reg("n0", "leader", 7), now_s=0.0)
    r.register(reg("n0", "follower", 7), now_s=1.0)  # check-quorum step-down keeps the term
    assert leader_of(r) == (None, 7)
    assert r.register(reg("n0", "leader", 7), now_s=2.0).stale
    assert not r.register(reg("n0", "leader", 9), now_s=3.0).stale


def test_a_candidate_at_a_new_term_may_then_lead_it() -> None:
    r = Registry()
    r.register(reg("n0", "leader", 7), now_s=0.0)
    r.register(reg("n0", "candidate", 8), now_s=1.0)
    assert leader_of(r) == (None, 8)
    assert not r.register(reg("n0", "leader", 8), now_s=2.0).stale


def test_an_older_registration_arriving_late_refreshes_liveness_but_not_the_record() -> None:
    r = Registry()
    r.register(reg("n0", "leader", 7), now_s=0.0)
    r.register(reg("n0", "follower", 6), now_s=5.0)  # delayed: must not step n0 down
    assert leader_of(r) == ("n0", 7)
    [node] = r.cluster(now_s=5.0)[0].nodes
    assert (node.role, node.term, node.last_seen_s_ago) == ("leader", 7, 0.0)


def test_followers_at_a_higher_term_do_not_clear_the_leader() -> None:
    r = Registry()
    r.register(reg("n0", "leader", 7), now_s=0.0)
    r.register(reg("n1", "follower", 8), now_s=1.0)
    assert leader_of(r) == ("n0", 7)


# -- leases ------------------------------------------------------------------------------------

def test_a_node_not_refreshed_within_the_lease_expires_and_a_refreshed_one_stays() -> None:
    r = Registry(lease_s=120.0)
    three_nodes(r, now_s=0.0)
    r.register(reg("n0", "leader", 7), now_s=100.0)
    r.register(reg("n1", "follower", 7, port=10912), now_s=100.0)
    assert r.expire(now_s=120.0) == []  # exactly at the lease: still in
    assert r.expire(now_s=120.5) == [("a", "n2")]
    assert [n.node_id for n in r.route("orders", 120.5)[0].nodes] == ["n0", "n1"]
    assert leader_of(r) == ("n0", 7)


def test_an_expired_leader_leaves_the_group_leaderless_until_a_registration_says_so() -> None:
    r = Registry(lease_s=10.0)
    three_nodes(r, now_s=0.0)
    for node in ("n1", "n2"):
        r.register(reg(node, "follower", 7, leader="n0"), now_s=8.0)
    assert r.expire(now_s=10.5) == [("a", "n0")]
    [route] = r.route("orders", 10.5)
    assert (route.leader, route.term) == (None, 7)  # still routed: topics from the freshest node
    assert not r.register(reg("n0", "leader", 7), now_s=11.0).stale  # same node, same term
    assert leader_of(r) == ("n0", 7)


# -- topics ------------------------------------------------------------------------------------

def test_topics_come_from_the_leaders_latest_registration() -> None:
    r = Registry()
    r.register(reg("n1", "follower", 7, topics={"orders": RW4, "old": RW4}, leader="n0"), 0.0)
    r.register(reg("n0", "leader", 7, topics={"orders": TopicRoute(8, 8, 6)}), now_s=0.0)
    assert r.topics() == ["orders"]
    assert r.route("old", 0.0) == []
    r.register(reg("n0", "leader", 7, topics={"orders": TopicRoute(16, 8, 2), "new": RW4}), 1.0)
    assert r.topics() == ["new", "orders"]
    [route] = r.route("orders", 1.0)
    assert (route.topic.read_queues, route.topic.write_queues, route.topic.perm) == (16, 8, 2)


def test_without_a_leader_topics_come_from_the_highest_term_node() -> None:
    r = Registry()
    r.register(reg("n1", "follower", 6, topics={"old": RW4}), now_s=5.0)
    r.register(reg("n2", "follower", 7, topics={"orders": RW4}), now_s=1.0)
    assert r.topics() == ["orders"]


def test_several_groups_serving_one_topic_are_all_routed_by_name() -> None:
    r = Registry()
    r.register(reg("m0", "leader", 3, group="b", topics={"orders": TopicRoute(2, 2, 6)}), 0.0)
    three_nodes(r)
    r.register(reg("x0", "leader", 1, group="c", topics={"other": RW4}), 0.0)
    routes = r.route("orders", 0.0)
    assert [(g.group, g.leader, g.topic.read_queues) for g in routes] == [("a", "n0", 4),
                                                                          ("b", "m0", 2)]
    assert r.topics() == ["orders", "other"]


# -- unregister --------------------------------------------------------------------------------

def test_unregister_removes_a_node_and_a_leader_leaving_gives_up_its_term() -> None:
    r = Registry()
    three_nodes(r)
    assert r.unregister(Unregistration("a", "n2", 7), 1.0) is True
    assert r.unregister(Unregistration("a", "n2", 7), 1.0) is False
    assert r.unregister(Unregistration("zz", "n0", 7), 1.0) is False
    assert r.unregister(Unregistration("a", "n0", 7), 2.0) is True
    assert leader_of(r) == (None, 7)
    assert r.register(reg("n0", "leader", 7), now_s=3.0).stale  # a delayed claim after leaving
    assert [n.node_id for n in r.cluster(3.0)[0].nodes] == ["n0", "n1"]


def test_unregister_must_name_the_registration_it_removes() -> None:
    r = Registry()
    r.register(Registration("a", "n0", "127.0.0.1:1", "127.0.0.1:2", "leader", 7, {"t": RW4},
                            instance="secret"), now_s=0.0)
    with pytest.raises(RegistrationMismatchError, match="registered at term 7"):
        r.unregister(Unregistration("a", "n0", 6, "secret"), 1.0)
    with pytest.raises(RegistrationMismatchError, match="another instance"):
        r.unregister(Unregistration("a", "n0", 7), 1.0)  # a spoof that read the term
    assert leader_of(r) == ("n0", 7) and r.route("t", 1.0)[0].leader == "n0"
    assert r.unregister(Unregistration("a", "n0", 7, "secret"), 2.0) is True


# -- bounds ------------------------------------------------------------------------------------

def test_the_node_and_group_bounds_raise_a_named_error_and_tombstones_make_room() -> None:
    r = Registry(lease_s=10.0, groups_max=2, nodes_per_group_max=2)
    r.register(reg("n0"), 0.0)
    r.register(reg("n1"), 0.0)
    with pytest.raises(RegistryFullError):
        r.register(reg("n2"), 0.0)
    r.register(reg("n0"), 0.0)  # a known node still refreshes
    r.register(reg("m0", group="b"), 5.0)
    with pytest.raises(RegistryFullError):
        r.register(reg("x0", group="c"), 5.0)
    r.expire(now_s=12.0)  # group a is now an empty tombstone: evicted for c
    r.register(reg("x0", group="c"), 12.0)
    assert [g.group for g in r.cluster(12.0)] == ["b", "c"]
    with pytest.raises(ValueError):
        Registry(lease_s=0)


# -- purity ------------------------------------------------------------------------------------

PURE_MODULES = ("namesrv/registry.py", "namesrv/model.py", "namesrv/errors.py")
PURE_IMPORTS = {"__future__", "dataclasses", "typing", "collections.abc", "re", "namesrv.errors",
                "namesrv.model",
                "protocol.broker_errors", "protocol.topics"}


def test_the_routing_table_and_model_import_nothing_with_io_or_a_clock() -> None:
    bad = []
    for rel in PURE_MODULES:
        tree = ast.parse((ROOT / rel).read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{rel}:{node.lineno} imports {n}" for n in names if n not in PURE_IMPORTS]
    assert bad == []
