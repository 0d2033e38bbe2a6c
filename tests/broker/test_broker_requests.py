"""Every request kind of the broker validated at the broker, over the wire: raw requests through
``LogClient.call`` (not the client library, which checks its own arguments), against a real
one-node broker process. Missing or extra arguments, wrong types and out-of-range values are
named BAD_REQUEST errors; reserved system topic names are refused; pulls obey the topic's read
permission and read-queue count, and offset commits need the topic and one of its read queues."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from broker.api.table import TABLE as HANDLERS
from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from protocol import broker_kinds as bp
from protocol.envelope import BadRequestError, RemoteError
from protocol.errors import DLedgerError
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow

BROKER = ("-m", "broker", "start")
Scenario = Callable[[LogClient, str], Awaitable[None]]


def run(tmp_path: Path, scenario: Scenario) -> None:
    async def main(cluster: LocalCluster) -> None:
        async with LogClient(cluster.client_addresses, timeout_s=5.0) as client:
            await wait_until(lambda: _leads(client), 30, "the node to lead")
            await scenario(client, "n0")

    with LocalCluster(str(tmp_path), size=1, tick_ms=50, program=BROKER) as cluster:
        asyncio.run(main(cluster))


async def _leads(client: LogClient) -> bool:
    try:
        return bool((await client.call("n0", bp.BROKER_STATUS))["raft"]["role"] == "leader")
    except DLedgerError:
        return False


def msg(body: bytes) -> list[Any]:
    return [body, "", [], "", [], 0]


async def send(client: LogClient, topic: str, queue_id: int, count: int) -> None:
    for i in range(count):
        await client.call("n0", bp.SEND, topic, queue_id, [msg(b"m%d" % i)])


async def bad(client: LogClient, kind: int, *args: Any, match: str) -> None:
    with pytest.raises(BadRequestError, match=match):
        await client.call("n0", kind, *args)


async def refused(client: LogClient, code: str, kind: int, *args: Any) -> str:
    with pytest.raises(RemoteError) as err:
        await client.call("n0", kind, *args)
    assert err.value.code == code, err.value
    return str(err.value)


PULL_OK = ("t", 0, 0, 32, 1 << 20, 0, [])


def test_negative_pull_limits_are_refused_and_zero_still_reads_the_queue_range(
        tmp_path: Path) -> None:
    async def scenario(client: LogClient, n0: str) -> None:
        await send(client, "t", 0, 5)
        # today's code answered max_messages -1 with all but the last message
        await bad(client, bp.PULL, "t", 0, 0, -1, 1 << 20, 0, [], match="max_messages")
        await bad(client, bp.PULL, "t", 0, 0, 32, -1, 0, [], match="max_bytes")
        await bad(client, bp.PULL, "t", 0, 0, 32, 1 << 20, -5, [], match="suspend_ms")
        await bad(client, bp.PULL, "t", 0, -1, 32, 1 << 20, 0, [], match="offset")
        await bad(client, bp.PULL, "t", -1, 0, 32, 1 << 20, 0, [], match="queue_id")
        await bad(client, bp.PULL, "t", True, 0, 32, 1 << 20, 0, [], match="queue_id")
        await bad(client, bp.PULL, "t", 0, "0", 32, 1 << 20, 0, [], match="offset must be an int")
        await bad(client, bp.PULL, "t", 0, 0, 32, 1 << 20, 0, "TagA", match="tags")
        await bad(client, bp.PULL, "t", 0, 0, 32, 1 << 20, 0, [1], match="tags")
        status, nxt, lo, hi, rows = await client.call(n0, bp.PULL, "t", 0, 0, 0, 0, 0, [])
        assert (status, nxt, lo, hi, rows) == (bp.NO_NEW_MSG, 0, 0, 5, [])
        status, nxt, _, _, rows = await client.call(n0, bp.PULL, *PULL_OK)
        assert (status, nxt, len(rows)) == (bp.FOUND, 5, 5)

    run(tmp_path, scenario)


ARITY = {  # a valid argument list per kind: one more or one fewer must be refused by name
    bp.PULL: list(PULL_OK),
    bp.PULL_SQL: [*PULL_OK[:-1], "a > 1"],
    bp.TOPIC_PUT: ["made", 4, 4, 6],
    bp.TOPIC_DELETE: ["made"],
    bp.OFFSET_COMMIT: ["g", "t", 0, 1],
    bp.OFFSET_QUERY: ["g", "t", 0],
    bp.SEARCH_OFFSET: ["t", 0, 0],
    bp.BROKER_STATUS: [],
    bp.TRANSFER_LEADERSHIP: ["n0"],
    bp.HEARTBEAT: ["c1", "g", "clustering", {"t": "*"}, 1000],
    bp.SEND_BACK: ["g", "t", 0, 0, 0, 16],
    bp.DLQ_RESEND: ["g", 0],
    bp.LOCK_BATCH: ["g", "c1", [["t", 0]]],
    bp.UNLOCK_BATCH: ["g", "c1", [["t", 0]]],
    bp.TXN_HALF: ["pg", "T1", "t", 0, [[b"x", "", [], "K", [], 0]]],
    bp.END_TRANSACTION: ["pg", "T1", "COMMIT", False, []],
    bp.PRODUCER_HEARTBEAT: ["c1", "pg", 1000],
    bp.OFFSET_RESET: ["g", "t", 0, False],
    bp.CONSUMER_STATUS: ["g"],
    bp.STATE_DIGEST: [],
    bp.MEMBER_ADD: ["n9", "127.0.0.1:1", 1000],
    bp.MEMBER_PROMOTE: ["n9", 1000],
    bp.MEMBER_REMOVE: ["n9", 1000],
    bp.VIEW_MESSAGE: ["a-0000000000000000-0"],
    bp.QUERY_BY_KEY: ["t", "k", 0, 1, 8],
    bp.QUERY_BY_UNIQUE_KEY: ["u", "", 8],
    bp.QUERY_BY_TIME: ["t", 0, 1, 8],
    bp.POP_RECEIVE: ["g", "t", -1, 4, 30_000, ["*"], "", 0, 16],
    bp.POP_ACK: ["g", "t", 0, [[0, 1]]],
    bp.POP_CHANGE: ["g", "t", 0, 0, 1, 30_000],
    bp.POP_DEAD: ["g", "t", 0, 0, 1, 16],
    bp.ACL_PUT: [["alice", "alice-secret-1", False, 0, 2, [], []]],
    bp.ACL_DELETE: ["alice"],
    bp.ACL_LIST: [""],
    bp.CONSUMER_RUNNING_INFO: ["g", "c1"],
    bp.CONSUME_DIRECTLY: ["g", "c1", "a-0000000000000000-0"],
    bp.RECALL: ["t", "m1", 0, 0],
    bp.SUBSCRIPTION_GROUP_PUT: ["g", 3],
    bp.SUBSCRIPTION_GROUP_GET: [""],
}


def test_every_kind_refuses_extra_and_missing_arguments_by_name(tmp_path: Path) -> None:
    assert set(ARITY) == set(HANDLERS)  # every kind of the table is covered

    async def scenario(client: LogClient, n0: str) -> None:
        await send(client, "t", 0, 1)
        for kind, args in ARITY.items():
            name = HANDLERS[kind].name
            await bad(client, kind, *args, "extra",
                      match=f"{name} takes {len(args)} arguments .*got {len(args) + 1}")
            if args:
                await bad(client, kind, *args[:-1],
                          match=f"{name} takes {len(args)} arguments .*got {len(args) - 1}")
        # the topic named in TOPIC_DELETE's refused requests still exists
        await client.call(n0, bp.TOPIC_PUT, "made", 4, 4, 6)
        assert await client.call(n0, bp.TOPIC_DELETE, "made") == "OK"

    run(tmp_path, scenario)


def test_fields_of_the_wrong_type_or_range_are_named(tmp_path: Path) -> None:
    async def scenario(client: LogClient, n0: str) -> None:
        await bad(client, bp.TOPIC_PUT, "x", -1, 4, 6, match="read_queues")
        await bad(client, bp.TOPIC_PUT, "x", 4, "4", 6, match="write_queues")
        await bad(client, bp.TOPIC_PUT, "x", 4, 4, 6.0, match="perm")
        await refused(client, "INVALID_TOPIC", bp.TOPIC_PUT, "x", 4, 4, 5)
        await bad(client, bp.OFFSET_COMMIT, "", "t", 0, 1, match="group")
        await bad(client, bp.TXN_HALF, "pg", "x" * 129, "t", 0, [[b"x", "", [], "K", [], 0]],
                  match="transaction_id")
        await bad(client, bp.TXN_HALF, "pg", "T", "t", 0, [], match="messages")
        await refused(client, "INVALID_TOPIC", bp.TXN_HALF, "pg", "T", "RMQ_SYS_TRANS_HALF_TOPIC",
                      0, [[b"x", "", [], "K", [], 0]])
        await refused(client, "BAD_TRANSACTION", bp.TXN_HALF, "pg", "T", "t", 0,
                      [[b"x", "", [], "K", [["DELAY", "3"]], 0]])
        await bad(client, bp.END_TRANSACTION, "pg", "T", "MAYBE", False, [], match="decision")
        await bad(client, bp.END_TRANSACTION, "pg", "T", "COMMIT", 1, [], match="from_check")
        await bad(client, bp.END_TRANSACTION, "pg", "T", "COMMIT", False, [["g", "t", 0, -2, 1]],
                  match="offsets")
        await refused(client, "TXN_NOT_FOUND", bp.END_TRANSACTION, "pg", "nope", "COMMIT",
                      False, [])
        await refused(client, "NO_PERMISSION", bp.PULL, "RMQ_SYS_TRANS_HALF_TOPIC", 0, 0, 1,
                      1 << 20, 0, [])
        await bad(client, bp.OFFSET_COMMIT, "g", "t", 0, -2, match="offset")
        await bad(client, bp.OFFSET_QUERY, ["g"], "t", 0, match="group")
        await bad(client, bp.SEARCH_OFFSET, "t", 0, -1, match="timestamp_ms")
        await bad(client, bp.HEARTBEAT, "c1", "g", "bogus", {}, 1000, match="model")
        await bad(client, bp.HEARTBEAT, "c1", "g", "clustering", [["t", "*"]], 1000,
                  match="subscriptions")
        await bad(client, bp.HEARTBEAT, "c1", "g", "clustering", {"t": 5}, 1000,
                  match="subscriptions")
        await bad(client, bp.HEARTBEAT, "c1", "g", "clustering", {}, -1, match="ttl_ms")
        await bad(client, bp.TRANSFER_LEADERSHIP, "nobody", match="not a voter")
        await bad(client, bp.SEND_BACK, "g", "t", 0, -1, 0, 16, match="offset")
        await bad(client, bp.SEND_BACK, "g", "t", 0, 0, "3", 16, match="delay_level")
        await bad(client, bp.SEND_BACK, "g", "t", 0, 0, 0, -1, match="max_reconsume_times")
        await bad(client, bp.DLQ_RESEND, "", 0, match="group")
        await bad(client, bp.LOCK_BATCH, "g", "c1", "t", match="queues")
        await bad(client, bp.UNLOCK_BATCH, "g", "", [["t", 0]], match="client_id")
        await bad(client, bp.OFFSET_RESET, "g", "t", 0, 1, match="force must be true or false")
        await bad(client, bp.OFFSET_RESET, "g", "t", -1, False, match="timestamp_ms")
        await bad(client, bp.CONSUMER_STATUS, "", match="group")
        for attempts in (0, 10_001, "3", True, 2.5):
            await bad(client, bp.SUBSCRIPTION_GROUP_PUT, "g", attempts,
                      match="max_delivery_attempts.*must be an integer in 1..10000")
        await bad(client, bp.SUBSCRIPTION_GROUP_PUT, "", 3, match="group")
        await bad(client, bp.SUBSCRIPTION_GROUP_GET, None, match="group")
        # an unknown kind is answered under its request id (today: id -1, the caller timed out)
        await bad(client, 150, 1, 2, match="unknown request kind 150")
        assert await client.call(n0, bp.HEARTBEAT, "c1", "g", "clustering", {"t": "*"},
                                 1000) == ["c1"]

    run(tmp_path, scenario)


RESERVED = ["RMQ_SYS_TRACE_TOPIC", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC",
            "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC",
            "OFFSET_MOVED_EVENT", "BenchmarkTest", "TBW102", "%RETRY%g", "%DLQ%g", "rmq_sys_x"]


def test_reserved_system_topic_names_cannot_be_created_deleted_or_sent_to_but_trace(
        tmp_path: Path) -> None:
    async def scenario(client: LogClient, n0: str) -> None:
        for name in RESERVED:
            await refused(client, "INVALID_TOPIC", bp.TOPIC_PUT, name, 4, 4, 6)
            await refused(client, "INVALID_TOPIC", bp.TOPIC_DELETE, name)
            if name != "RMQ_SYS_TRACE_TOPIC":
                await refused(client, "INVALID_TOPIC", bp.SEND, name, 0, [msg(b"x")])
        assert not set(RESERVED) & set((await client.call(n0, bp.BROKER_STATUS))["topics"])
        # but the trace topic takes the tracing clients' sends, and its first one creates it
        assert (await client.call(n0, bp.SEND, "RMQ_SYS_TRACE_TOPIC", 0, [msg(b"x")]))[0] \
            == "SEND_OK"
        assert "RMQ_SYS_TRACE_TOPIC" in (await client.call(n0, bp.BROKER_STATUS))["topics"]
        await refused(client, "INVALID_TOPIC", bp.TOPIC_DELETE, "RMQ_SYS_TRACE_TOPIC")
        # reading a system topic is not refused (consumers pull their retry topics)
        assert (await client.call(n0, bp.PULL, "%RETRY%g", 0, 0, 1, 1, 0, []))[0] == bp.NO_NEW_MSG

    run(tmp_path, scenario)


def test_pulls_obey_read_permission_and_the_read_queue_count(tmp_path: Path) -> None:
    async def scenario(client: LogClient, n0: str) -> None:
        assert await client.call(n0, bp.TOPIC_PUT, "wo", 4, 4, 2) == "OK"  # write only
        await send(client, "wo", 0, 3)
        detail = await refused(client, "NO_PERMISSION", bp.PULL, "wo", 0, 0, 32, 1 << 20, 0, [])
        assert "not readable" in detail
        assert await client.call(n0, bp.TOPIC_PUT, "narrow", 2, 4, 6) == "OK"  # 2 read queues
        await send(client, "narrow", 3, 2)
        assert (await client.call(n0, bp.PULL, "narrow", 1, 0, 32, 1 << 20, 0, []))[0] \
            == bp.NO_NEW_MSG
        detail = await refused(client, "QUEUE_NOT_FOUND", bp.PULL, "narrow", 3, 0, 32, 1 << 20,
                               0, [])
        assert "2 read queues" in detail
        await refused(client, "QUEUE_NOT_FOUND", bp.OFFSET_COMMIT, "g", "narrow", 3, 1)
        await refused(client, "TOPIC_NOT_FOUND", bp.OFFSET_COMMIT, "g", "nosuch", 0, 1)
        # reads of offsets only: answered, as RocketMQ does (nothing was committed there)
        assert await client.call(n0, bp.OFFSET_QUERY, "g", "narrow", 3) == -1
        assert await client.call(n0, bp.SEARCH_OFFSET, "narrow", 3, 0) == 0
        assert await client.call(n0, bp.OFFSET_COMMIT, "g", "narrow", 1, 0) == "OK"
        assert await client.call(n0, bp.OFFSET_QUERY, "g", "narrow", 1) == 0
        # giving the topic its read permission back makes its messages readable again
        assert await client.call(n0, bp.TOPIC_PUT, "wo", 4, 4, 6) == "OK"
        assert len((await client.call(n0, bp.PULL, "wo", 0, 0, 32, 1 << 20, 0, []))[4]) == 3

    run(tmp_path, scenario)
