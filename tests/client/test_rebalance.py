"""Queue allocation strategies: every queue has exactly one owner, every member computes the same
answer, and the shares are balanced (averagely and by circle) or stable (consistent hash); by
config takes exactly its queues, by machine room only its rooms' queues, machine room nearby each
room's queues within the room and a room without members' queues among all (issue 34 item 9)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client import PushConsumer
from client.consumer.lite import LitePullConsumer
from client.consumer.rebalance import (
    STRATEGIES,
    averagely,
    by_circle,
    by_config,
    by_machine_room,
    consistent_hash,
    machine_room_nearby,
    room_of_client,
    room_of_group,
    strategy_of,
)
from client.types import MessageQueue

clients = st.lists(st.text("abcdef", min_size=1, max_size=4), min_size=1, max_size=6, unique=True)
queue_counts = st.integers(0, 20)


def qs(n: int) -> list[MessageQueue]:
    return [MessageQueue("t", "a" if i % 2 else "b", i) for i in range(n)]


@given(cs=clients, n=queue_counts)
def test_every_queue_has_exactly_one_owner(cs: list[str], n: int) -> None:
    for name, strategy in STRATEGIES.items():
        owned = [q for c in cs for q in strategy(c, list(reversed(cs)), qs(n))]
        assert sorted(owned) == sorted(qs(n)), name


@given(cs=clients, n=queue_counts)
def test_averagely_is_balanced(cs: list[str], n: int) -> None:
    sizes = [len(averagely(c, cs, qs(n))) for c in cs]
    assert max(sizes) - min(sizes) <= 1


def test_a_stranger_gets_nothing() -> None:
    for strategy in STRATEGIES.values():
        assert strategy("zz", ["a", "b"], qs(4)) == []


def test_consistent_hash_moves_few_queues_when_a_member_joins() -> None:
    before = {q: c for c in ["a", "b", "c"] for q in consistent_hash(c, ["a", "b", "c"], qs(60))}
    after = {q: c for c in ["a", "b", "c", "d"] for q in consistent_hash(c, ["a", "b", "c", "d"], qs(60))}
    moved = [q for q in before if before[q] != after[q]]
    assert all(after[q] == "d" for q in moved)  # only queues taken over by the newcomer move


# -- configured strategies (RocketMQ's by config, by machine room, machine room nearby) ----------

ROOMS = ("east", "west", "north")
rooms_of = st.lists(st.sampled_from(ROOMS), min_size=1, max_size=6)


def room_queues(rooms: list[str], per_group: int = 2) -> list[MessageQueue]:
    """``per_group`` queues of one group per entry of ``rooms``, named ``<room>.g<k>``."""
    return [MessageQueue("t", f"{room}.g{k}", q) for k, room in enumerate(rooms)
            for q in range(per_group)]


def test_by_config_takes_exactly_its_queues_that_exist_whoever_else_is_there() -> None:
    mine = [MessageQueue("t", "a", 1), MessageQueue("t", "b", 2), MessageQueue("u", "a", 0)]
    strategy = by_config(mine)
    assert strategy("me", ["me", "you"], qs(8)) == [MessageQueue("t", "a", 1),
                                                   MessageQueue("t", "b", 2)]
    assert strategy("me", ["me"], [MessageQueue("u", "a", q) for q in range(2)]) == [
        MessageQueue("u", "a", 0)]  # (each topic's own; a queue that does not exist: none)
    assert strategy("stranger", [], qs(8)) == strategy("me", ["me"], qs(8))
    with pytest.raises(ValueError, match="one MessageQueue or more"):
        by_config([])


def test_rooms_come_from_the_mapping_else_the_name() -> None:
    assert room_of_group("east.a") == "east"
    assert room_of_group("a") is None and room_of_group(".a") is None
    assert room_of_group("a", {"a": "west"}) == "west"
    assert room_of_group("east.a", {"east.a": "west"}) == "west"  # the mapping wins
    assert room_of_client("east@worker-1") == "east" and room_of_client("worker") is None


@given(cs=clients, mine=st.sets(st.sampled_from(ROOMS), min_size=1), rooms=rooms_of)
def test_by_machine_room_shares_the_rooms_queues_once_and_no_other(
        cs: list[str], mine: set[str], rooms: list[str]) -> None:
    strategy = by_machine_room(mine)
    queues = room_queues(rooms)
    owned = [q for c in cs for q in strategy(c, list(reversed(cs)), queues)]
    assert sorted(owned) == sorted(q for q in queues if q.group.split(".")[0] in mine)
    sizes = [len(strategy(c, cs, queues)) for c in cs]
    assert max(sizes) - min(sizes) <= 1  # (averagely inside)


def test_by_machine_room_reads_a_mapping_of_plain_group_names() -> None:
    strategy = by_machine_room({"east"}, group_rooms={"a": "east", "b": "west"})
    assert strategy("c1", ["c1"], qs(4)) == [q for q in sorted(qs(4)) if q.group == "a"]
    with pytest.raises(ValueError, match="one room name or more"):
        by_machine_room(set())


@given(members=st.lists(st.tuples(st.sampled_from((*ROOMS, "south")), st.integers(0, 3)),
                        min_size=1, max_size=6, unique=True), rooms=rooms_of)
def test_machine_room_nearby_keeps_a_rooms_queues_in_the_room_and_shares_the_orphans(
        members: list[tuple[str, int]], rooms: list[str]) -> None:
    cs = [f"{room}@w{k}" for room, k in members]
    strategy = machine_room_nearby()
    queues = [*room_queues(rooms), MessageQueue("t", "roomless", 0)]
    owner = {q: c for c in cs for q in strategy(c, list(reversed(cs)), queues)}
    assert sum(len(strategy(c, cs, queues)) for c in cs) == len(queues), "one owner each"
    assert sorted(owner) == sorted(queues)
    with_members = {room_of_client(c) for c in cs}
    for q, c in owner.items():
        room = room_of_group(q.group)
        if room in with_members:
            assert room_of_client(c) == room, f"{q} left its room for {c}"


def test_machine_room_nearby_with_an_inner_strategy_and_a_resolver() -> None:
    queues = room_queues(["east", "east", "west"])  # 4 east queues, 2 west, no west member
    strategy = machine_room_nearby(by_circle, client_room=lambda c: c.split("-")[0])
    cs = ["east-1", "east-2", "north-1"]
    got = {c: strategy(c, cs, queues) for c in cs}
    east = [q for q in sorted(queues) if q.group.startswith("east")]
    assert got["east-1"][:2] == [east[0], east[2]] and got["east-2"][:2] == [east[1], east[3]]
    west = sorted(q for q in queues if q.group.startswith("west"))
    assert sorted(q for c in cs for q in got[c] if q in west) == west  # shared by all three
    assert strategy("stranger", cs, queues) == []


def test_strategies_are_chosen_by_name_or_given_built() -> None:
    assert strategy_of("by_circle") is by_circle
    built = by_config(qs(2))
    assert strategy_of(built) is built
    with pytest.raises(ValueError, match=r"takes a configuration: give strategy=.*by_config"):
        strategy_of("by_config")
    with pytest.raises(ValueError, match="strategy is one of averagely"):
        strategy_of("nearest")
    consumer = PushConsumer("127.0.0.1:1", "g", print, strategy=by_machine_room({"east"}))
    assert consumer.strategy("c", ["c"], qs(2)) == []  # (no group of qs is in a room)
    lite = LitePullConsumer("127.0.0.1:1", "g", strategy=machine_room_nearby())
    assert lite.strategy("c", ["c"], qs(2)) == sorted(qs(2))
    with pytest.raises(ValueError, match="takes a configuration"):
        PushConsumer("127.0.0.1:1", "g", print, strategy="machine_room")
