"""Producer groups: the broker's table of live producers and their connections
(``broker.core.clients``: heartbeats, expiry, a closed connection's producers gone, round robin),
the client's reading of a CHECK_TRANSACTION frame (``client.producer.group``), which takes
garbage without raising, and its heartbeat rounds: one that missed a node is repeated within a
second, then 2, 4... up to the period (a node back from a crash must know the producers before
it leads and checks back; one that never answers costs a round per period)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker.core.clients import ClientGroups
from broker.core.members import MAX_MEMBERS
from client.cluster.routes import GroupRoute
from client.producer import group as producer_group
from client.producer.group import (
    HEARTBEAT_INTERVAL_S,
    RETRY_S,
    ProducerRegistration,
    check_group,
    next_pause_s,
    parse_check,
)
from protocol.errors import DLedgerError


def test_heartbeats_expire_leave_and_fall_with_their_connection() -> None:
    table: ClientGroups[str] = ClientGroups()
    assert table.heartbeat("p1", "pg", "conn1", 30, now=0) == ["p1"]
    assert table.heartbeat("p2", "pg", "conn2", 10, now=1) == ["p1", "p2"]
    assert table.snapshot(now=12) == {"pg": ["p1"]}  # p2's ttl ran out
    table.heartbeat("p3", "pg", "conn1", 30, now=12)
    table.drop("conn1")  # p1 and p3 heartbeat on that connection: both gone
    assert table.snapshot(now=13) == {}
    table.heartbeat("p4", "pg", "conn4", 30, now=14)
    assert table.heartbeat("p4", "pg", "conn4", 0, now=15) == []  # ttl 0: it leaves


def test_a_check_goes_to_each_live_member_in_turn() -> None:
    table: ClientGroups[str] = ClientGroups()
    for k in range(3):
        table.heartbeat(f"p{k}", "pg", f"c{k}", 30, now=0)
    picked = [p.client_id for p in (table.pick("pg", now=1) for _ in range(6)) if p]
    assert sorted(picked) == ["p0", "p0", "p1", "p1", "p2", "p2"]
    assert table.pick("other", now=1) is None
    assert table.pick("pg", now=100) is None  # all expired


def test_a_group_holds_a_bounded_number_of_members() -> None:
    table: ClientGroups[int] = ClientGroups()
    for k in range(MAX_MEMBERS + 5):
        table.heartbeat(f"p{k}", "pg", k, 30, now=0)
    assert len(table.snapshot(now=1)["pg"]) == MAX_MEMBERS


def check_fields(**over: Any) -> list[Any]:
    msg = [7, b"body", "TAGC", [], "KEY", [["REAL_TOPIC", "TTopic"], ["REAL_QID", "2"],
                                          ["TRAN_MSG", "true"]], 5, 6, "a-0000000000000001-0"]
    fields = {"broker_group": "a", "producer_group": "tpg", "txn": "KEY", "checks": 1,
              "messages": [msg], **over}
    return list(fields.values())


def test_a_check_frame_names_the_real_topic_and_queue() -> None:
    check = parse_check(check_fields())
    assert check is not None
    assert (check.broker_group, check.producer_group, check.transaction_id, check.checks) == \
        ("a", "tpg", "KEY", 1)
    m = check.message
    assert (m.queue.topic, m.queue.group, m.queue.queue_id, m.body, m.tags, m.msg_id) == \
        ("TTopic", "a", 2, b"body", "TAGC", "KEY")


@pytest.mark.parametrize("fields", [
    [], ["a"], check_fields(messages=[]), check_fields(messages="x"),
    check_fields(messages=[[1, 2]]), check_fields(checks="x"), [None] * 5, "garbage",
])
def test_a_malformed_check_frame_is_ignored_not_raised(fields: Any) -> None:
    assert parse_check(fields) is None


@pytest.mark.parametrize("bad", ["", "x" * 256, 3, None])
def test_a_producer_group_is_a_short_name(bad: Any) -> None:
    with pytest.raises(ValueError):
        check_group(bad)


class _DownThenUp:
    """A group client whose node n1 refuses the first ``down`` heartbeats."""

    def __init__(self, down: int) -> None:
        self.down = down
        self.beats: list[str] = []

    def set_push_handler(self, handler: Any) -> None:
        pass

    async def call(self, node: str, *args: Any, timeout_s: float) -> list[str]:
        self.beats.append(node)
        if node == "n1" and self.down > 0:
            self.down -= 1
            raise DLedgerError("connection refused")
        return ["p"]


class _Routes:
    def __init__(self, client: _DownThenUp) -> None:
        self.client = client

    async def cluster_groups(self) -> list[GroupRoute]:
        return [GroupRoute("g", "n0", {"n0": ("127.0.0.1", 1), "n1": ("127.0.0.1", 2)},
                           0, 0, 6, 1, {})]

    def group_client(self, g: GroupRoute) -> _DownThenUp:
        return self.client


def test_a_round_that_missed_a_node_is_repeated_within_a_second(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []

    async def pause(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 6:
            raise asyncio.CancelledError  # the loop's stop

    monkeypatch.setattr(producer_group, "_pause", pause)
    client = _DownThenUp(down=3)  # the start's round and the next two miss n1
    reg = ProducerRegistration(_Routes(client), "pg", "p")  # type: ignore[arg-type]

    async def main() -> None:
        await reg.start()
        assert reg.missed == 1
        assert reg._task is not None
        with pytest.raises(asyncio.CancelledError):
            await reg._task
    asyncio.run(main())
    assert pauses == [RETRY_S, 2 * RETRY_S, 4 * RETRY_S, HEARTBEAT_INTERVAL_S,
                      HEARTBEAT_INTERVAL_S, HEARTBEAT_INTERVAL_S]
    assert client.beats.count("n1") == 6 and reg.missed == 0


def test_a_node_that_never_answers_costs_a_round_per_period_not_per_second() -> None:
    pause_s, backoff_s, pauses = 0.0, RETRY_S, []
    for _ in range(8):
        pause_s, backoff_s = next_pause_s(1, backoff_s)
        pauses.append(pause_s)
    assert pauses == [1, 2, 4, 8, 10, 10, 10, 10]
    assert next_pause_s(0, backoff_s) == (HEARTBEAT_INTERVAL_S, RETRY_S)  # reached: reset
