"""Queue allocation strategies: every queue has exactly one owner, every member computes the same
answer, and the shares are balanced (averagely and by circle) or stable (consistent hash)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from client.consumer.rebalance import STRATEGIES, averagely, consistent_hash
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
