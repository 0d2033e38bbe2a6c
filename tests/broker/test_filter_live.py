"""SQL92 filtering end to end (the issue's item 4, the broker's side; the language itself is
tests/broker/test_filter_sql.py): PULL_SQL over the wire returns only matching messages while the offsets
of the skipped ones still advance, a malformed expression is a BAD_REQUEST naming its offset,
and the client refuses one at ``subscribe`` with ``BadFilterError``; a push consumer subscribed
with the seed's FilterBySQLConsumer expression gets exactly the matching messages."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from click.testing import CliRunner

from cli import main as cli_main
from client import BadFilterError, Message, Producer, PullConsumer, PushConsumer, ReceivedMessage
from client.consumer.orderly import OrderlyPushConsumer
from dledger.client import LogClient
from protocol import broker_kinds as bp
from protocol.envelope import BadRequestError
from tests.clusters import namesrv_group
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow
FAST = dict(heartbeat_s=0.3, rebalance_s=0.5, commit_s=0.3, suspend_ms=300, start_from="first")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with namesrv_group(tmp_path_factory.mktemp("sql"), size=1) as (ns, c):
        yield ns, c


async def send_ages(ns: str, topic: str, count: int) -> None:
    async with Producer(ns) as producer:  # the seed's producer: property "age" = i, tags by i % 3
        queue = (await producer.queues(topic))[0]  # one queue: offsets are i
        for i in range(count):
            await producer.send_to(Message(topic, b"m%d" % i, tags=f"Tag{'ABC'[i % 3]}",
                                           properties={"age": str(i)}), queue)


def test_pull_sql_returns_the_matches_and_passes_the_offsets_of_the_rest(cluster: Any) -> None:
    ns, local = cluster

    async def run() -> None:
        await send_ages(ns, "ages", 10)
        async with LogClient(local.client_addresses, timeout_s=5.0) as raw:
            args = ("ages", 0, 0, 32, 1 << 20, 0)
            status, nxt, lo, hi, rows = await raw.call("n0", bp.PULL_SQL, *args,
                                                       "age between 0 and 6 AND TAGS <> 'TagB'")
            assert (status, nxt, lo, hi) == (bp.FOUND, 10, 0, 10)
            assert [r[0] for r in rows] == [0, 2, 3, 5, 6]  # 1 and 4 are TagB
            # nothing matches: no message, yet the next offset is past every one examined
            status, nxt, _, _, rows = await raw.call("n0", bp.PULL_SQL, *args, "age > 100")
            assert (status, nxt, rows) == (bp.NO_NEW_MSG, 10, [])
            status, nxt, _, _, rows = await raw.call("n0", bp.PULL_SQL, "ages", 0, 0, 4, 1 << 20,
                                                     0, "missing IS NULL")
            assert (nxt, [r[0] for r in rows]) == (4, [0, 1, 2, 3])
            with pytest.raises(BadRequestError, match="sql SQL filter at offset 5: expected a property"):
                await raw.call("n0", bp.PULL_SQL, *args, "age >")
            with pytest.raises(BadRequestError, match="sql must be an SQL92 expression string"):
                await raw.call("n0", bp.PULL_SQL, *args, ["age > 1"])
        async with PullConsumer(ns, "sql-pull") as pc:
            mq = (await pc.fetch_queues("ages"))[0]
            res = await pc.pull(mq, 0, 32, sql="age IN ('3', '7')")
            assert [m.body for m in res.messages] == [b"m3", b"m7"] and res.next_offset == 10
            with pytest.raises(BadFilterError) as err:
                await pc.pull(mq, 0, sql="age BETWEEN 1 AND")
            assert err.value.offset == 17
            with pytest.raises(ValueError, match="not both"):
                await pc.pull(mq, 0, tags=["TagA"], sql="age > 1")
    asyncio.run(run())


def test_a_malformed_expression_is_refused_at_subscribe_naming_its_offset() -> None:
    for cls in (PushConsumer, OrderlyPushConsumer):
        c = cls("127.0.0.1:1", "g", lambda batch: None)
        with pytest.raises(BadFilterError, match="offset 6") as err:
            c.subscribe("t", sql="a = 1 b")
        assert err.value.offset == 6 and isinstance(err.value, ValueError)
        with pytest.raises(ValueError, match="not both"):
            c.subscribe("t", "TagA", sql="a = 1")


def test_a_push_consumer_subscribed_by_sql_gets_exactly_the_matching_messages(cluster: Any) -> None:
    ns, _ = cluster

    async def run() -> None:
        got: list[ReceivedMessage] = []
        c = PushConsumer(ns, "sql-push", got.extend, consume_batch_max=4, pull_batch_max=5,
                         **FAST)
        c.subscribe("kids", sql="age between 0 and 6")  # the seed's FilterBySQLConsumer
        async with await c.start():
            await send_ages(ns, "kids", 20)
            await wait_until(lambda: len(got) >= 7, 30, "the seven matching messages")
            async with PullConsumer(ns, "sql-push") as pc:
                mq = (await pc.fetch_queues("kids"))[0]

                async def committed_all() -> bool:
                    return await pc.committed(mq) == 20  # the skipped offsets count as consumed
                await wait_until(committed_all, 20, "the group's offset at the queue's end")
        assert sorted(int(dict(m.properties)["age"]) for m in got) == list(range(7))
    asyncio.run(run())


def test_dledger_consume_filters_by_sql_and_names_a_malformed_expression(cluster: Any) -> None:
    ns, _ = cluster
    asyncio.run(send_ages(ns, "cli-ages", 6))
    runner = CliRunner()
    out = runner.invoke(cli_main, ["consume", "--namesrv", ns, "--sql", "age >= 4", "cli-ages"])
    assert out.exit_code == 0, out.output
    assert [line.rsplit(" ", 1)[-1] for line in out.output.splitlines()] == ["b'm4'", "b'm5'"]
    out = runner.invoke(cli_main, ["consume", "--namesrv", ns, "--tags", "TagA", "cli-ages"])
    assert [line.rsplit(" ", 1)[-1] for line in out.output.splitlines()] == ["b'm0'", "b'm3'"]
    bad = runner.invoke(cli_main, ["consume", "--namesrv", ns, "--sql", "age >= ", "cli-ages"])
    assert bad.exit_code == 2 and "SQL filter at offset 7" in bad.output, bad.output
