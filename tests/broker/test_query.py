"""Message query on real processes (issue 18, item 4): a message sent through a group is found by
offset msg id on every replica, by unique key, and by key within a time range (not outside it);
a refused duplicate and a delayed message's schedule copy do not show as messages of their own;
``consumed_by`` follows committed offsets; every message of a topic within a time range is found
without a key, newest first, at most as many as asked (issue 34 item 20), and a range that ends
before it begins is refused by name, by the client and by the broker; ``dledger message
show/query`` print them; after a restart of every node, with one node's index file damaged and
another's deleted, every node still answers (the index reloaded, or rebuilt from the log)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import main as dledger_main
from cli.common import ms_iso
from client import (
    Message,
    MessageNotFoundError,
    MessageQuery,
    NonRetriableError,
    Producer,
    PullConsumer,
    SyncMessageQuery,
)
from client.types import MessageQueue, SendResult
from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from protocol import broker_kinds as bp
from protocol.envelope import BadRequestError
from protocol.errors import DLedgerError
from tests.clusters import namesrv_group, routed
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow

TOPIC = "orders"


async def on_every_node(cluster: LocalCluster, kind: int, *args: object) -> dict[str, object]:
    """Each node's answer, once every node has one (followers apply a moment later)."""
    answers: dict[str, object] = {}
    async with LogClient(cluster.client_addresses, timeout_s=5) as client:
        async def all_answer() -> bool:
            for nid in cluster.servers:
                try:
                    got = await client.call(nid, kind, *args)
                except DLedgerError:
                    continue
                if got:
                    answers[nid] = got
            return len(answers) == len(cluster.servers)
        await wait_until(all_answer, 20, f"every node to answer {kind} {args}")
    return answers


async def _clock_past(ms: int) -> None:
    await wait_until(lambda: time.time() * 1000 > ms + 2, 5, "the clock to move on")


def test_found_by_id_on_every_replica_by_unique_key_and_by_key_in_range(tmp_path: Path) -> None:
    with namesrv_group(tmp_path, "--delay-levels", "300ms") as (ns, cluster):
        first, late, early_ts = asyncio.run(_scenario(ns, cluster))
        _cli(ns, first, late, early_ts)


async def _scenario(ns: str, cluster: LocalCluster) -> tuple[SendResult, SendResult, int]:
    async with Producer(ns) as p, MessageQuery(ns) as q:
        first = [await p.send(Message(TOPIC, f"early {i}".encode(), tags="t",
                                      keys=["order-1", f"n{i}"], properties={"p": "v"}))
                 for i in range(3)]
        found = await q.view(first[0].offset_msg_id)
        early_ts = max([found.store_ts_ms] + [(await q.view(r.offset_msg_id)).store_ts_ms
                                               for r in first[1:]])
        await _clock_past(early_ts)
        late = await p.send(Message(TOPIC, b"\xff\x00late", keys="order-1"))
        delayed = await p.send(Message(TOPIC, b"delayed", keys="order-2", delay_level=1))

        assert (found.body, found.topic, found.tags, found.keys) == (
            b"early 0", TOPIC, "t", ("order-1", "n0"))
        assert (found.queue_id, found.queue_offset, found.unique_key) == (
            first[0].queue.queue_id, first[0].queue_offset, first[0].msg_id)
        assert ("p", "v") in found.properties and found.consumed_by == ()

        # by offset msg id, on every replica
        rows = await on_every_node(cluster, bp.VIEW_MESSAGE, late.offset_msg_id)
        assert {bytes(r[5]) for r in rows.values()} == {b"\xff\x00late"}  # type: ignore[index]

        # by key within a time range, and not outside it
        everything = await q.by_key(TOPIC, "order-1")
        assert [m.body for m in everything] == [b"\xff\x00late", b"early 2", b"early 1",
                                                b"early 0"]
        early = await q.by_key(TOPIC, "order-1", 0, early_ts)
        assert sorted(m.body for m in early) == [b"early 0", b"early 1", b"early 2"]
        assert [m.body for m in await q.by_key(TOPIC, "order-1", early_ts + 1)] == [b"\xff\x00late"]
        assert len(await q.by_key(TOPIC, "order-1", max_messages=2)) == 2
        assert await q.by_key(TOPIC, "n1", 0, early_ts) != []
        assert await q.by_key(TOPIC, "order-1", 0, 1000) == []
        assert await q.by_key("elsewhere", "order-1") == []

        # by unique key: once, whatever the retries
        assert [m.body for m in await q.by_unique_key(first[1].msg_id)] == [b"early 1"]
        assert [m.body for m in await q.by_unique_key(first[1].msg_id, TOPIC)] == [b"early 1"]
        assert await q.by_unique_key(first[1].msg_id, "elsewhere") == []
        async with LogClient(cluster.client_addresses, timeout_s=5) as client:
            raw = [[b"dup", "", ["dupkey"], "U-dup", [], 0]]
            await client.call_leader(bp.SEND, TOPIC, 0, raw)
            again = (await client.call_leader(bp.SEND, TOPIC, 0, raw))[1]
            assert again[4] == [True]  # the dedup table refused it: stored once
        assert [m.body for m in await q.by_unique_key("U-dup")] == [b"dup"]
        assert [m.body for m in await q.by_key(TOPIC, "dupkey")] == [b"dup"]

        # a delayed message: found once, in its real topic, once delivered
        async def delivered() -> bool:
            return [m.topic for m in await q.by_key(TOPIC, "order-2")] == [TOPIC]
        await wait_until(delivered, 20, "the delayed message in its real topic")
        assert [m.topic for m in await q.by_unique_key(delayed.msg_id)] == [TOPIC]

        # by time, whatever the keys (issue 34 item 20: RocketMQ's queryMessage without a key)
        early = await q.by_time(TOPIC, 0, early_ts)
        assert sorted(m.body for m in early) == [b"early 0", b"early 1", b"early 2"]
        everything = await q.by_time(TOPIC)
        assert {m.body for m in everything} == {b"early 0", b"early 1", b"early 2",
                                                 b"\xff\x00late", b"delayed", b"dup"}
        stored = [m.store_ts_ms for m in everything]
        assert stored == sorted(stored, reverse=True)  # newest first
        assert {m.body for m in await q.by_time(TOPIC, early_ts + 1)} == {
            b"\xff\x00late", b"delayed", b"dup"}
        newest = await q.by_time(TOPIC, max_messages=2)
        assert [m.offset_msg_id for m in newest] == [m.offset_msg_id for m in everything[:2]]
        assert await q.by_time("elsewhere") == [] and await q.by_time(TOPIC, 0, 1000) == []
        for bad in ({"begin_ms": 10, "end_ms": 5}, {"max_messages": 0},
                    {"max_messages": 1025}):
            with pytest.raises(ValueError):
                await q.by_time(TOPIC, **bad)  # type: ignore[arg-type]
        async with LogClient(cluster.client_addresses, timeout_s=5) as client:
            for args, says in (((10, 5, 8), "begin_ms 10 is after end_ms 5"),
                               ((0, 5, 0), "max_messages must be"),
                               ((0, 5, 1025), "max_messages must be"),
                               ((-1, 5, 8), "begin_ms must be")):
                with pytest.raises(BadRequestError, match=says):
                    await client.call("n0", bp.QUERY_BY_TIME, TOPIC, *args)

        # consumed by: a group whose committed offset is past it
        async with PullConsumer(ns, "billing") as c:
            mq = MessageQueue(TOPIC, first[0].queue.group, first[0].queue.queue_id)
            await c.commit(mq, first[0].queue_offset + 1)
        assert (await q.view(first[0].offset_msg_id)).consumed_by == ("billing",)

        # named errors
        with pytest.raises(MessageNotFoundError):
            await q.view(f"{first[0].queue.group}-{2**40:016X}-0")
        with pytest.raises(ValueError):
            await q.view("not-an-id")
        async with LogClient(cluster.client_addresses, timeout_s=5) as client:
            with pytest.raises(BadRequestError, match="offset_msg_id is not an offset msg id"):
                await client.call("n0", bp.VIEW_MESSAGE, "a-12-0")
        with pytest.raises(NonRetriableError):
            await q.by_key(TOPIC, "")
    return first[0], late, early_ts


def _cli(ns: str, first: SendResult, late: SendResult, early_ts: int) -> None:
    with SyncMessageQuery(ns) as sq:  # the blocking twin
        assert sq.view(first.offset_msg_id).body == b"early 0"
        assert [m.body for m in sq.by_unique_key(late.msg_id)] == [b"\xff\x00late"]
        assert len(sq.by_key(TOPIC, "order-1", max_messages=3)) == 3
        assert len(sq.by_time(TOPIC, 0, early_ts)) == 3
    runner = CliRunner()
    shown = runner.invoke(dledger_main, ["message", "show", "--namesrv", ns, first.offset_msg_id])
    assert shown.exit_code == 0, shown.output
    assert "body (7 bytes): early 0" in shown.output and "consumed by: billing" in shown.output
    assert f"queue: {first.queue.queue_id}  offset: {first.queue_offset}" in shown.output
    listed = runner.invoke(dledger_main, ["message", "query", "--namesrv", ns, "--topic", TOPIC,
                                          "--key", "order-1"])
    assert listed.exit_code == 0 and listed.output.count("offset_msg_id:") == 4, listed.output
    assert "hex:ff006c617465" in listed.output
    by_unique = runner.invoke(dledger_main, ["message", "query", "--namesrv", ns,
                                             "--unique-key", late.msg_id])
    assert by_unique.exit_code == 0 and by_unique.output.count("offset_msg_id:") == 1
    missing = runner.invoke(dledger_main, ["message", "show", "--namesrv", ns, "bad"])
    assert missing.exit_code != 0
    by_time = runner.invoke(dledger_main, ["message", "query", "--namesrv", ns, "--topic", TOPIC,
                                           "--end", ms_iso(early_ts)])
    assert by_time.exit_code == 0 and by_time.output.count("offset_msg_id:") == 3, by_time.output
    capped = runner.invoke(dledger_main, ["message", "query", "--namesrv", ns, "--topic", TOPIC,
                                          "--max", "5"])
    assert capped.exit_code == 0 and capped.output.count("offset_msg_id:") == 5, capped.output
    backwards = runner.invoke(dledger_main, ["message", "query", "--namesrv", ns, "--topic",
                                             TOPIC, "--begin", ms_iso(early_ts),
                                             "--end", ms_iso(early_ts - 1)])
    assert backwards.exit_code == 2 and "is before --begin" in backwards.output


def test_every_node_restarted_reloads_or_rebuilds_its_index(tmp_path: Path) -> None:
    with namesrv_group(tmp_path, "--checkpoint-interval-s", "0.3", "--index-slots", "64",
                       "--index-entries-per-file", "40") as (ns, cluster):
        results = asyncio.run(_send_keyed(ns, 60))  # 120 keys: 3 files and more
        asyncio.run(_checkpointed(cluster))
        cluster.stop()
        index_n1 = os.path.join(cluster.servers["n1"].data_dir, "index")
        damaged = sorted(os.listdir(index_n1))[1]
        with open(os.path.join(index_n1, damaged), "r+b") as f:
            f.write(b"\0" * 1024)  # both superblocks
        index_n2 = os.path.join(cluster.servers["n2"].data_dir, "index")
        for name in os.listdir(index_n2):
            os.unlink(os.path.join(index_n2, name))
        cluster.start()
        asyncio.run(_all_found(ns, cluster, results))


class _Sent:
    def __init__(self, key: str, offset_msg_id: str, msg_id: str, index: int) -> None:
        self.key, self.offset_msg_id, self.msg_id, self.index = key, offset_msg_id, msg_id, index


async def _send_keyed(ns: str, n: int) -> list[_Sent]:
    out = []
    async with Producer(ns) as p:
        for i in range(n):
            r = await p.send(Message(TOPIC, f"m{i}".encode(), keys=f"k{i}"))
            out.append(_Sent(f"k{i}", r.offset_msg_id, r.msg_id, i))
    return out


async def _checkpointed(cluster: LocalCluster) -> None:
    """Every node has written a checkpoint covering the sends (their index with it)."""
    async with LogClient(cluster.client_addresses, timeout_s=5) as client:
        leader_applied = max([int((await client.call(nid, bp.BROKER_STATUS))["applied_index"])
                              for nid in cluster.servers])

        async def written() -> bool:
            for nid in cluster.servers:
                st = await client.call(nid, bp.BROKER_STATUS)
                if st["key_index"]["checkpointed_index"] < leader_applied:
                    return False
            return True
        await wait_until(written, 20, "a checkpoint on every node")


async def _all_found(ns: str, cluster: LocalCluster, sent: list[_Sent]) -> None:
    async with LogClient(cluster.client_addresses, timeout_s=5) as client:
        async def caught_up() -> bool:
            try:
                return all([await client.call(nid, bp.QUERY_BY_KEY, TOPIC, sent[-1].key, 0,
                                              2**63 - 1, 8) for nid in cluster.servers])
            except DLedgerError:
                return False
        await wait_until(caught_up, 30, "every node to answer after the restart")
        for nid in cluster.servers:
            for s in sent:
                rows = await client.call(nid, bp.QUERY_BY_KEY, TOPIC, s.key, 0, 2**63 - 1, 8)
                assert [r[0] for r in rows] == [s.offset_msg_id], (nid, s.key)
                assert (await client.call(nid, bp.VIEW_MESSAGE, s.offset_msg_id))[5] == \
                    f"m{s.index}".encode()
        st = await client.call("n1", bp.BROKER_STATUS)
        assert st["key_index"]["rebuilt_files"] >= 1
    await routed(ns)  # registered again
    async with MessageQuery(ns) as q:
        assert [m.body for m in await q.by_unique_key(sent[7].msg_id)] == [b"m7"]


@pytest.mark.parametrize("text, group", [
    ("a-00000000000000A0-0", "a"),
    ("orders-east-00000000000000A0-12", "orders-east"),
    ("a-00000000000000a0-0", None),  # lowercase hex: not a form the broker writes or reads
    ("a-A0-0", None),
    ("-00000000000000A0-0", None),
    ("a-00000000000000A0-x", None),
])
def test_the_client_reads_an_offset_msg_id_as_the_broker_does(text: str,
                                                              group: str | None) -> None:
    from client.cluster.query import group_of
    if group is None:
        with pytest.raises(ValueError, match="not an offset msg id"):
            group_of(text)
        with pytest.raises(ValueError):
            bp.parse_offset_msg_id(text)
    else:
        assert group_of(text) == group == bp.parse_offset_msg_id(text)[0]
