"""``dledger consumer reset-offset`` and ``dledger consumer status`` on a 3-node group (issue 18's
admin part): a reset by time lands on the first message stored at or after it on every queue,
as one entry every replica applies; a group with a live member on the topic is refused
(GROUP_ACTIVE) unless ``--force``; the status shows the member with its subscriptions as every
node knows them, and each queue's committed offset, max offset and lag."""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from typing import Any

import pytest
from click.testing import CliRunner, Result

from broker.core.entries import TopicPut
from broker.features.admin.entries import OffsetReset
from broker.machine.kinds import decode, encode
from broker.machine.state import BrokerState
from cli import main as cli_main
from client import (
    ConsumerGroupActiveError,
    ConsumeStatus,
    Message,
    MessageQueue,
    Producer,
    PullConsumer,
    PushConsumer,
    ReceivedMessage,
)
from dledger.client import LogClient
from protocol import broker_kinds as bp
from protocol.broker_kinds import RESET_EARLIEST_MS
from tests.clusters import namesrv_group
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow  # (the first test is pure; the rest start processes)
TOPIC = "reset-me"
# 1 s heartbeats: a member expires after 3 s (0.3 s gave 0.9 s, which a loaded CI run's stall of
# the test's process, the CLI running in a thread of it, can pass: the member then leaves, comes
# back, re-reads the forced offsets and consumes anew, so the replicas never all read the force)
FAST = dict(heartbeat_s=1.0, rebalance_s=0.5, commit_s=0.3, suspend_ms=300, start_from="first")


def test_an_offset_reset_entry_round_trips_and_applies_all_its_queues_at_once() -> None:
    entry = OffsetReset("g", "t", ((0, 5), (1, 0), (2, 7)))
    assert decode(encode(entry)) == entry
    state = BrokerState()
    assert state.apply(1, 0, encode(entry)).status == "TOPIC_NOT_FOUND"  # nothing set
    assert state.offsets == {}
    state.apply(2, 0, encode(TopicPut("t", 4, 4, 6)))
    assert state.apply(3, 0, encode(entry)).status == "OK"
    assert state.offsets == {("g", "t", 0): 5, ("g", "t", 1): 0, ("g", "t", 2): 7}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with namesrv_group(tmp_path_factory.mktemp("admin")) as (ns, c):
        yield ns, c


def cli(ns: str, *args: str) -> Result:
    return CliRunner().invoke(cli_main, [*args, "--namesrv", ns])


async def replica_offsets(local: Any, group: str) -> dict[str, dict[tuple[str, int], int]]:
    """Each node's own (applied) offsets of ``group`` on TOPIC, through CONSUMER_STATUS."""
    async with LogClient(local.client_addresses, timeout_s=5.0) as raw:
        out = {}
        for node in sorted(local.client_addresses):
            st = await raw.call(node, bp.CONSUMER_STATUS, group)
            out[node] = {(TOPIC, q): c for t, q, c, _ in st["queues"] if t == TOPIC}
        return out


async def stored(ns: str) -> dict[MessageQueue, list[ReceivedMessage]]:
    async with PullConsumer(ns, "reader") as c:
        return {mq: list((await c.pull(mq, 0, 1024)).messages)
                for mq in await c.fetch_queues(TOPIC)}


def test_reset_by_time_on_every_queue_and_replica_refused_while_live_unless_forced(
        cluster: Any) -> None:
    ns, local = cluster

    async def run() -> None:
        async with Producer(ns) as p:
            early = [await p.send(Message(TOPIC, b"early%d" % i)) for i in range(8)]
            last_early = max(m.store_ts_ms for ms in (await stored(ns)).values() for m in ms)
            await wait_until(lambda: time.time() * 1000 > last_early + 5, 5, "the clock to move")
            for i in range(8):
                await p.send(Message(TOPIC, b"late%d" % i))
        messages = await stored(ns)
        assert len(messages) == 4 and sum(map(len, messages.values())) == 16
        cut_ms = min(m.store_ts_ms for ms in messages.values() for m in ms
                     if m.body.startswith(b"late"))
        assert cut_ms > last_early
        expected = {(TOPIC, mq.queue_id): next(m.queue_offset for m in ms
                                               if m.store_ts_ms >= cut_ms)
                    for mq, ms in messages.items()}
        async with PullConsumer(ns, "g") as c:  # the group had consumed everything
            for mq, ms in messages.items():
                await c.commit(mq, len(ms))
        iso = datetime.datetime.fromtimestamp(cut_ms / 1000, datetime.UTC).isoformat()
        got = await asyncio.to_thread(cli, ns, "consumer", "reset-offset", "g", TOPIC,
                                      "--to-timestamp", iso)
        assert got.exit_code == 0, got.output
        for (_, qid), new in expected.items():
            assert f"a/{qid}" in got.output and f"{len(messages[MessageQueue(TOPIC, 'a', qid)])}"\
                f" -> {new}" in got.output, got.output
        async def replicated() -> bool:
            return all(o == expected for o in (await replica_offsets(local, "g")).values())
        await wait_until(replicated, 10, "every replica to apply the reset")
        assert all(e.queue.group == "a" for e in early)

        latest = {(TOPIC, mq.queue_id): len(ms) for mq, ms in messages.items()}
        got = await asyncio.to_thread(cli, ns, "consumer", "reset-offset", "g", TOPIC,
                                      "--to-latest")
        assert got.exit_code == 0, got.output

        last_read: list[Any] = [None]  # (what the replicas read last: a failure shows it)

        async def everywhere(offsets: dict[tuple[str, int], int]) -> bool:
            last_read[0] = await replica_offsets(local, "g")
            return all(o == offsets for o in last_read[0].values())
        await wait_until(lambda: everywhere(latest), 10, "every replica to reset to the latest")

        # a live member of the group on the topic: refused (CLI and request); --force resets,
        # and the member's next commit overwrites it, as the command's help says
        seen: list[ReceivedMessage] = []

        def listener(batch: list[ReceivedMessage]) -> ConsumeStatus:
            seen.extend(batch)
            return ConsumeStatus.SUCCESS
        consumer = PushConsumer(ns, "g", listener, **FAST)
        consumer.subscribe(TOPIC, "TagA || TagB")
        async with await consumer.start():
            refused = await asyncio.to_thread(cli, ns, "consumer", "reset-offset", "g", TOPIC,
                                              "--to-earliest")
            assert refused.exit_code == 1 and "live member" in refused.output, refused.output
            assert consumer.client_id in refused.output
            async with PullConsumer(ns, "g") as raw:
                with pytest.raises(ConsumerGroupActiveError, match="live member"):
                    await raw._call(MessageQueue(TOPIC, "a", 0), bp.OFFSET_RESET, "g", TOPIC,
                                    RESET_EARLIEST_MS, False, leader=True)
            assert await everywhere(latest)

            status = await asyncio.to_thread(cli, ns, "consumer", "status", "g", "--json")
            assert status.exit_code == 0, status.output
            report = json.loads(status.output)
            (member,) = report["members"]
            assert member["client_id"] == consumer.client_id and member["model"] == "clustering"
            assert member["subscriptions"] == {TOPIC: "TagA || TagB", "%RETRY%g": "*"}
            assert sorted(member["seen_by"]) == ["a/n0", "a/n1", "a/n2"]
            rows = {(r["topic"], r["queue"]): r for r in report["queues"]}
            for (_, qid), size in latest.items():
                row = rows[(TOPIC, f"a/{qid}")]
                assert (row["committed"], row["max"], row["lag"]) == (size, size, 0)
                assert row["from_leader"]
            text = await asyncio.to_thread(cli, ns, "consumer", "status", "g")
            assert consumer.client_id in text.output and "TagA || TagB" in text.output
            assert "a/n0 a/n1 a/n2" in text.output and "total lag: 0" in text.output

            forced = await asyncio.to_thread(cli, ns, "consumer", "reset-offset", "g", TOPIC,
                                             "--to-earliest", "--force")
            assert forced.exit_code == 0 and "will overwrite" in forced.output, forced.output
            assert "a/0" in forced.output and f"{latest[(TOPIC, 0)]} -> 0" in forced.output
            zero = {k: 0 for k in latest}
            try:
                await wait_until(lambda: everywhere(zero), 10, "every replica to apply the force")
            except AssertionError as err:
                raise AssertionError(f"{err}; the replicas read {last_read[0]}, the member "
                                     f"was handed {len(seen)} messages") from None
            # the member knew nothing of it: its next commit (after a new message) overwrites
            async with Producer(ns) as p:
                sent = await p.send_to(Message(TOPIC, b"after", tags="TagA"),
                                       MessageQueue(TOPIC, "a", 0))
            async with PullConsumer(ns, "g") as c:
                async def overwritten() -> bool:
                    return await c.committed(sent.queue) == sent.queue_offset + 1
                await wait_until(overwritten, 10, "the live member's commit over the reset")
            assert [m.body for m in seen] == [b"after"]

        # the usage errors
        both = await asyncio.to_thread(cli, ns, "consumer", "reset-offset", "g", TOPIC,
                                       "--to-earliest", "--to-latest")
        assert both.exit_code == 2 and "give one of" in both.output
        bad = await asyncio.to_thread(cli, ns, "consumer", "reset-offset", "g", TOPIC,
                                      "--to-timestamp", "yesterday")
        assert bad.exit_code == 2 and "not an ISO 8601 time" in bad.output
        missing = await asyncio.to_thread(cli, ns, "consumer", "reset-offset", "g", "nosuch",
                                          "--to-latest")
        assert missing.exit_code == 1 and "no broker group serves" in missing.output
    asyncio.run(run())
