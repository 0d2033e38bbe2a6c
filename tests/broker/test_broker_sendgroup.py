"""Group commit of sends on the leader (``broker.api.sendgroup``): the requests of one loop turn
become one entry, whatever their topics and queues (one run per queue); each request gets its own
slices of the entry's answer, one per run of its own, in order; bounds split groups; a refused
run fails only the requests that sent to it; failures reach every request of the group."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

from broker.api.sendgroup import SendGroups
from protocol.broker_errors import BrokerError
from protocol.errors import NotLeaderError


class Leader:
    """A stand-in for the server: records proposed entries (their runs); answers them when
    told, each run from its own offset counter, refusing the runs of topics in ``read_only``."""

    def __init__(self) -> None:
        self.proposed: list[tuple[list[tuple[tuple[str, int], list[list[Any]]]], asyncio.Future[Any]]] = []
        self.refuse: Exception | None = None
        self.read_only: set[str] = set()

    def propose(self, runs: list[tuple[tuple[str, int], list[list[Any]]]],
                queues: dict[str, int]) -> asyncio.Future[Any]:
        if self.refuse is not None:
            raise self.refuse
        fut = asyncio.get_running_loop().create_future()
        self.proposed.append(([(key, list(ms)) for key, ms in runs], fut))
        return fut

    def answer(self, entry: Any) -> list[list[Any]]:
        runs, start = entry  # the "committed" value: the runs and their first queue offset
        out: list[list[Any]] = []
        for (topic, queue_id), ms in runs:
            if topic in self.read_only:
                out.append(["NO_PERMISSION", topic])
                continue
            n = len(ms)
            out.append(["SEND_OK", queue_id, [start + k for k in range(n)],
                        [f"{topic}{queue_id}-{start + k}" for k in range(n)], [False] * n,
                        [queue_id] * n])
        return out


def run(topic: str, queue_id: int, *bodies: bytes) -> tuple[str, int, list[list[Any]], int]:
    return topic, queue_id, [[b, "", [], "", [], 0] for b in bodies], sum(map(len, bodies))


def bodies(leader: Leader) -> list[list[tuple[str, int, list[bytes]]]]:
    return [[(t, q, [m[0] for m in ms]) for (t, q), ms in runs] for runs, _ in leader.proposed]


def test_requests_of_one_loop_turn_share_one_entry_over_queues_and_topics() -> None:
    async def main() -> None:
        leader = Leader()
        groups = SendGroups(leader.propose, leader.answer)
        replies: dict[str, Any] = {}

        def reply_to(name: str) -> Any:
            return lambda answers, err: replies.__setitem__(name, (answers, err))

        groups.add([run("t", 0, b"a")], reply_to("r1"))
        groups.add([run("t", 1, b"x"), run("u", 0, b"u1")], reply_to("r2"))
        groups.add([run("t", 0, b"b", b"c"), run("u", 0, b"u2")], reply_to("r3"))
        assert leader.proposed == []  # nothing leaves before the loop turn ends
        await asyncio.sleep(0)  # one loop turn: the flush runs
        assert bodies(leader) == [[("t", 0, [b"a", b"b", b"c"]), ("t", 1, [b"x"]),
                                   ("u", 0, [b"u1", b"u2"])]]  # one entry, runs by first arrival
        runs, fut = leader.proposed[0]
        fut.set_result((runs, 10))
        await asyncio.sleep(0)  # the done callbacks run
        assert replies["r1"] == ([["SEND_OK", 0, [10], ["t0-10"], [False], [0]]], None)
        assert replies["r2"] == ([["SEND_OK", 1, [10], ["t1-10"], [False], [1]],
                                  ["SEND_OK", 0, [10], ["u0-10"], [False], [0]]], None)
        assert replies["r3"] == ([["SEND_OK", 0, [11, 12], ["t0-11", "t0-12"], [False, False],
                                   [0, 0]], ["SEND_OK", 0, [11], ["u0-11"], [False], [0]]], None)
        assert (groups.entries_proposed, groups.requests_grouped) == (1, 3)

    asyncio.run(main())


def test_a_refused_run_fails_only_the_requests_that_sent_to_it() -> None:
    async def main() -> None:
        leader = Leader()
        leader.read_only = {"ro"}
        groups = SendGroups(leader.propose, leader.answer)
        replies: dict[str, Any] = {}
        groups.add([run("ok", 0, b"1"), run("ro", 0, b"2")],
                   lambda answers, err: replies.__setitem__("both", answers))
        groups.add([run("ok", 0, b"3")], lambda answers, err: replies.__setitem__("ok", answers))
        await asyncio.sleep(0)
        runs, fut = leader.proposed[0]
        fut.set_result((runs, 0))
        await asyncio.sleep(0)
        assert replies["both"][1] == ["NO_PERMISSION", "ro"] and replies["both"][0][2] == [0]
        assert replies["ok"] == [["SEND_OK", 0, [1], ["ok0-1"], [False], [0]]]

    asyncio.run(main())


def test_bounds_close_a_group_over_all_its_runs_and_a_large_request_travels_alone() -> None:
    async def main() -> None:
        leader = Leader()
        groups = SendGroups(leader.propose, leader.answer, max_bytes=10, max_messages=3)
        noop = lambda answers, err: None  # noqa: E731
        groups.add([run("t", 0, b"a"), run("u", 0, b"b")], noop)
        groups.add([run("t", 1, b"c", b"d")], noop)  # 4 messages > 3: a new group
        groups.add([run("t", 0, b"e" * 50)], noop)  # 50 bytes > 10: a new group, alone
        groups.add([run("v", 0, b"f")], noop)
        await asyncio.sleep(0)  # one loop turn: the flush runs (grouping is per turn, by design)
        assert bodies(leader) == [[("t", 0, [b"a"]), ("u", 0, [b"b"])], [("t", 1, [b"c", b"d"])],
                                  [("t", 0, [b"e" * 50])], [("v", 0, [b"f"])]]

    asyncio.run(main())


def test_a_failure_reaches_every_request_of_the_group() -> None:
    async def main() -> None:
        leader = Leader()
        groups = SendGroups(leader.propose, leader.answer)
        errors: list[Exception | None] = []
        record = lambda answers, err: errors.append(err)  # noqa: E731
        groups.add([run("t", 0, b"a")], record)
        groups.add([run("u", 1, b"b")], record)
        await asyncio.sleep(0)  # one loop turn: the flush runs
        leader.proposed[0][1].set_exception(BrokerError("leadership lost"))
        await asyncio.sleep(0)  # the done callbacks run
        assert [str(e) for e in errors] == ["leadership lost", "leadership lost"]
        # refused at proposal time (this node is no longer the leader): answered at once
        leader.refuse = NotLeaderError("n2", 3)
        groups.add([run("t", 0, b"c")], record)
        await asyncio.sleep(0)  # one loop turn: the flush runs and meets the refusal
        assert isinstance(errors[-1], NotLeaderError) and len(errors) == 3

    asyncio.run(main())


def test_an_entry_refused_as_a_whole_refuses_each_of_its_runs() -> None:
    async def main() -> None:
        leader = Leader()
        groups = SendGroups(leader.propose, lambda committed: [["BAD_ENTRY", "garbled"]])
        got: list[Any] = []
        groups.add([run("t", 0, b"a"), run("u", 0, b"b")], lambda answers, err: got.append(answers))
        await asyncio.sleep(0)
        leader.proposed[0][1].set_result(None)
        await asyncio.sleep(0)
        assert got == [[["BAD_ENTRY", "garbled"], ["BAD_ENTRY", "garbled"]]]

    asyncio.run(main())


def test_message_ids_of_an_entry_name_its_group_position_and_slot() -> None:
    from protocol.broker_kinds import offset_msg_id
    assert offset_msg_id("g1", 0x2A, 3) == "g1-000000000000002A-3"


class _Msg(list[Any]):
    """A message in entry form that a weak reference can watch."""


def test_a_group_holds_no_message_once_its_entry_is_proposed() -> None:
    """Between proposing an entry and answering it (replication, fsync) the group keeps only its
    runs' keys: the leader would otherwise hold every request in flight decoded."""
    async def main() -> None:
        proposed: list[tuple[list[tuple[str, int]], asyncio.Future[Any]]] = []

        def propose(runs: list[tuple[tuple[str, int], list[list[Any]]]],
                    queues: dict[str, int]) -> asyncio.Future[Any]:
            fut = asyncio.get_running_loop().create_future()
            proposed.append(([key for key, _ in runs], fut))  # encoded, as the server does
            return fut

        def answer(counts: list[int]) -> list[list[Any]]:
            return [["SEND_OK", 0, list(range(n)), [f"m{k}" for k in range(n)], [False] * n,
                     [0] * n] for n in counts]

        groups = SendGroups(propose, answer)
        watched = [_Msg([b"a", "", [], "", [], 0]), _Msg([b"b", "", [], "", [], 0])]
        refs = [weakref.ref(m) for m in watched]
        replies: list[Any] = []
        groups.add([("t", 0, [watched[0]], 1), ("u", 0, [watched[1]], 1)],
                   lambda answers, err: replies.append((answers, err)))
        del watched
        assert all(r() is not None for r in refs)  # held until the loop turn's flush
        await asyncio.sleep(0)
        gc.collect()
        assert [r() for r in refs] == [None, None]
        keys, fut = proposed[0]
        assert keys == [("t", 0), ("u", 0)]
        fut.set_result([1, 1])
        await asyncio.sleep(0)
        assert replies == [([["SEND_OK", 0, [0], ["m0"], [False], [0]]] * 2, None)]

    asyncio.run(main())
