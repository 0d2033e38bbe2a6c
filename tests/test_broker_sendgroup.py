"""Group commit of sends on the leader (``broker.sendgroup``): requests to one queue in one loop
turn become one entry; each request gets its own slice of the entry's answer, in order; bounds
split groups; failures reach every request of the group."""

from __future__ import annotations

import asyncio
from typing import Any

from broker.errors import BrokerError
from broker.sendgroup import SendGroups
from dledger.errors import NotLeaderError


class Leader:
    """A stand-in for the server: records proposed groups; answers them when told."""

    def __init__(self) -> None:
        self.proposed: list[tuple[str, int, list[list[Any]], asyncio.Future[Any]]] = []
        self.refuse: Exception | None = None

    def propose(self, topic: str, queue_id: int, messages: list[list[Any]]) -> asyncio.Future[Any]:
        if self.refuse is not None:
            raise self.refuse
        fut = asyncio.get_running_loop().create_future()
        self.proposed.append((topic, queue_id, list(messages), fut))
        return fut

    @staticmethod
    def answer(entry: Any) -> list[Any]:
        start, n = entry  # the "committed" value: first queue offset and message count
        return ["SEND_OK", 0, [start + k for k in range(n)], [f"id{start + k}" for k in range(n)],
                [False] * n, [0] * n]


def msgs(*bodies: bytes) -> list[list[Any]]:
    return [[b, "", [], "", [], 0] for b in bodies]


def test_requests_in_one_loop_turn_share_an_entry_and_get_their_own_slices() -> None:
    async def run() -> None:
        leader = Leader()
        groups = SendGroups(leader.propose, leader.answer)
        replies: dict[str, Any] = {}

        def reply_to(name: str) -> Any:
            return lambda answer, err: replies.__setitem__(name, (answer, err))

        groups.add("t", 0, msgs(b"a"), 1, reply_to("r1"))
        groups.add("t", 1, msgs(b"x"), 1, reply_to("other-queue"))
        groups.add("t", 0, msgs(b"b", b"c"), 2, reply_to("r2"))
        assert leader.proposed == []  # nothing leaves before the loop turn ends
        await asyncio.sleep(0)  # one loop turn: the flush runs
        assert [(t, q, [m[0] for m in ms]) for t, q, ms, _ in leader.proposed] == [
            ("t", 0, [b"a", b"b", b"c"]), ("t", 1, [b"x"])]
        leader.proposed[0][3].set_result((10, 3))
        leader.proposed[1][3].set_result((0, 1))
        await asyncio.sleep(0)  # the done callbacks run
        assert replies["r1"] == (["SEND_OK", 0, [10], ["id10"], [False], [0]], None)
        assert replies["r2"] == (["SEND_OK", 0, [11, 12], ["id11", "id12"], [False, False], [0, 0]], None)
        assert replies["other-queue"][0][2] == [0]
        assert (groups.entries_proposed, groups.requests_grouped) == (2, 3)

    asyncio.run(run())


def test_bounds_close_a_group_and_a_large_request_travels_alone() -> None:
    async def run() -> None:
        leader = Leader()
        groups = SendGroups(leader.propose, leader.answer, max_bytes=10, max_messages=3)
        noop = lambda answer, err: None  # noqa: E731
        groups.add("t", 0, msgs(b"a", b"b"), 2, noop)
        groups.add("t", 0, msgs(b"c", b"d"), 2, noop)  # 4 messages > 3: a new group
        groups.add("t", 0, msgs(b"e"), 50, noop)  # 52 bytes > 10: a new group, alone
        groups.add("t", 0, msgs(b"f"), 1, noop)
        await asyncio.sleep(0)  # one loop turn: the flush runs (grouping is per turn, by design)
        assert [[m[0] for m in ms] for _, _, ms, _ in leader.proposed] == [
            [b"a", b"b"], [b"c", b"d"], [b"e"], [b"f"]]

    asyncio.run(run())


def test_a_failure_reaches_every_request_of_the_group() -> None:
    async def run() -> None:
        leader = Leader()
        groups = SendGroups(leader.propose, leader.answer)
        errors: list[Exception | None] = []
        record = lambda answer, err: errors.append(err)  # noqa: E731
        groups.add("t", 0, msgs(b"a"), 1, record)
        groups.add("t", 0, msgs(b"b"), 1, record)
        await asyncio.sleep(0)  # one loop turn: the flush runs
        leader.proposed[0][3].set_exception(BrokerError("leadership lost"))
        await asyncio.sleep(0)  # the done callbacks run
        assert [str(e) for e in errors] == ["leadership lost", "leadership lost"]
        # refused at proposal time (this node is no longer the leader): answered at once
        leader.refuse = NotLeaderError("n2", 3)
        groups.add("t", 0, msgs(b"c"), 1, record)
        await asyncio.sleep(0)  # one loop turn: the flush runs and meets the refusal
        assert isinstance(errors[-1], NotLeaderError) and len(errors) == 3

    asyncio.run(run())


def test_message_ids_of_an_entry_name_its_group_position_and_slot() -> None:
    from broker.protocol import offset_msg_id, offset_msg_ids
    assert offset_msg_id("g1", 0x2A, 3) == "g1-000000000000002A-3"
    assert offset_msg_ids("g1", 0x2A, 3) == [offset_msg_id("g1", 0x2A, k) for k in range(3)]
