"""The web console's endpoints against a real cluster (a NameServer process and a 3-node broker
group), without a browser: the snapshot's shape (every node's role, term, indexes, the
followers' lag), topics created and updated through the console with their queue offsets and
rates, message search by queue and offset, by offset msg id, by key and by unique key, a
consumer group's lag and an offset reset, a leader transfer, and the cluster's refusals as
named 404s."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from client import Message, MessageQueue, Producer, PullConsumer
from tests.clusters import console_ok, namesrv_group
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow

TIMEOUT = aiohttp.ClientTimeout(total=30)
TOPIC = "console-orders"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with namesrv_group(tmp_path_factory.mktemp("console")) as (ns, _):
        yield ns


async def call(session: aiohttp.ClientSession, method: str, url: str,
               body: Any = None) -> tuple[int, Any]:
    async with session.request(method, url, json=body) as resp:
        return resp.status, await resp.json()


def test_the_snapshot_shows_every_node_with_one_leader(cluster: str) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
            async def snapshot() -> dict[str, Any]:
                status, snap = await call(s, "GET", f"http://{cluster}/console/api/snapshot")
                assert status == 200
                return dict(snap)
            seen = [await console_ok(snapshot)]
        (group,) = seen[0]["groups"]
        assert group["group"] == "a" and group["health"] == "ok"
        assert group["voters"] == ["n0", "n1", "n2"]
        roles = {n["node"]: n["role"] for n in group["nodes"]}
        assert sorted(roles.values()) == ["follower", "follower", "leader"]
        leader = next(n for n in group["nodes"] if n["role"] == "leader")
        assert group["leader"] == leader["node"] and group["term"] == leader["term"]
        assert set(leader["followers"]) == set(roles) - {leader["node"]}
        for n in group["nodes"]:
            assert n["applied_index"] <= n["commit_index"] <= n["last_index"]
            assert n["registration"]["admin_address"]
        for f in leader["followers"].values():
            assert f["lag"] >= 0 and isinstance(f["last_contact_ticks"], int)
            ticks = f["last_contact_ticks"]  # (-1: never heard since it took over)
            assert f["last_contact_ms"] == (-1 if ticks < 0 else ticks * 50)  # tick_ms 50
    asyncio.run(main())


def test_topics_messages_consumers_and_actions_through_the_console(cluster: str) -> None:
    base = f"http://{cluster}/console/api"

    async def main() -> None:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
            status, made = await call(s, "POST", base + "/topics",
                                      {"mode": "create", "name": TOPIC, "queues": 2})
            assert status == 200, made
            assert [(g["group"], g["read_queues"], g["perm"]) for g in made["groups"]] == [
                ("a", 2, 6)]
            topic = await _topic_once_routed(s, base, 2)
            assert [q["queue"] for q in topic["queues"]] == ["a/0", "a/1"]
            assert all(q["min"] == q["max"] == 0 for q in topic["queues"])

            sent = await _send(cluster)
            topic = await _rate_after_sends(s, base, cluster)
            assert topic["messages"] == len(sent) + 3 and topic["rate"] > 0

            first = sent[0]
            status, found = await call(s, "GET", f"{base}/messages?topic={TOPIC}&queue="
                                                 f"a/{first.queue.queue_id}&offset={first.queue_offset}")
            assert status == 200 and found["search"] == "offset"
            assert found["messages"][0]["offset_msg_id"] == first.offset_msg_id
            assert found["messages"][0]["body"] == "m0"
            status, one = await call(s, "GET", f"{base}/messages/{first.offset_msg_id}")
            assert status == 200
            assert (one["topic"], one["keys"], one["tags"], one["msg_id"]) == (
                TOPIC, ["k0"], "tagA", first.msg_id)
            _, by_key = await call(s, "GET", f"{base}/messages?topic={TOPIC}&key=k1")
            assert [m["body"] for m in by_key["messages"]] == ["m1"]
            _, by_unique = await call(s, "GET", f"{base}/messages?unique_key={first.msg_id}")
            assert [m["offset_msg_id"] for m in by_unique["messages"]] == [first.offset_msg_id]

            await _consumer_group_and_reset(s, base, cluster)

            status, updated = await call(s, "POST", base + "/topics",
                                         {"mode": "update", "name": TOPIC, "queues": 3})
            assert status == 200 and updated["groups"][0]["read_queues"] == 3
            assert updated["groups"][0]["perm"] == 6  # what was not given stays
            await _topic_once_routed(s, base, 3)
    asyncio.run(main())


async def _topic_once_routed(s: aiohttp.ClientSession, base: str, queues: int) -> dict[str, Any]:
    """The topic's row once the NameServer routes it with ``queues`` queues (its leader
    registers the change at once, but asynchronously)."""
    seen: list[dict[str, Any]] = []

    async def routed() -> bool:
        status, body = await call(s, "GET", f"{base}/topics?topic={TOPIC}")
        if status == 200 and len(body["topics"][0]["queues"]) == queues:
            seen.append(body["topics"][0])
        return bool(seen)
    await wait_until(routed, 20, f"{TOPIC} routed with {queues} queues")
    return seen[-1]


async def _send(ns: str, prefix: str = "") -> list[Any]:
    async with Producer(ns) as p:
        return [await p.send(Message(TOPIC, f"{prefix}m{i}".encode(), tags="tagA",
                                     keys=(f"{prefix}k{i}",)))
                for i in range(3)]


async def _rate_after_sends(s: aiohttp.ClientSession, base: str, ns: str) -> dict[str, Any]:
    """A first sample, three more messages, then samples until one gives a rate."""
    await call(s, "GET", f"{base}/topics?topic={TOPIC}")
    await _send(ns, prefix="more-")
    seen: list[dict[str, Any]] = []

    async def rated() -> bool:
        _, body = await call(s, "GET", f"{base}/topics?topic={TOPIC}")
        if body["topics"][0]["rate"] is not None:
            seen.append(body["topics"][0])
        return bool(seen)
    await wait_until(rated, 20, "a rate from two samples")
    return seen[-1]


async def _consumer_group_and_reset(s: aiohttp.ClientSession, base: str, ns: str) -> None:
    async with PullConsumer(ns, "console-cg") as c:
        await c.commit(MessageQueue(TOPIC, "a", 0), 1)
        await c.commit(MessageQueue(TOPIC, "a", 1), 0)
    status, report = await call(s, "GET", base + "/consumer-groups/console-cg")
    assert status == 200, report
    rows = {r["queue"]: r for r in report["queues"]}
    assert set(rows) == {"a/0", "a/1"} and rows["a/0"]["committed"] == 1
    assert report["total_lag"] == sum(r["max"] for r in rows.values()) - 1
    assert report["members"] == [] and report["retry"] is None and report["dlq"] is None

    async def listed() -> bool:  # no member and no retry topic: known by its offsets alone
        status, body = await call(s, "GET", base + "/consumer-groups")
        return status == 200 and "console-cg" in body["consumer_groups"]
    await wait_until(listed, 20, "the group listed by its committed offsets")
    status, reset = await call(s, "POST", base + "/reset-offset",
                               {"consumer_group": "console-cg", "topic": TOPIC, "to": "latest"})
    assert status == 200, reset
    assert {q["queue"]: q["after"] for q in reset["queues"]} == {
        q: r["max"] for q, r in rows.items()}
    _, report = await call(s, "GET", base + "/consumer-groups/console-cg")
    assert report["total_lag"] == 0


def test_a_leader_transfer_through_the_console(cluster: str) -> None:
    base = f"http://{cluster}/console/api"

    async def main() -> None:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
            async def snapshot() -> dict[str, Any]:
                return dict((await call(s, "GET", base + "/snapshot"))[1])
            group = (await console_ok(snapshot))["groups"][0]
            to = next(n["node"] for n in group["nodes"] if n["role"] == "follower")
            status, moved = await call(s, "POST", base + "/leader-transfer",
                                       {"group": "a", "to": to})
            assert status == 200, moved
            assert (moved["from"], moved["to"]) == (group["leader"], to)

            async def shown() -> bool:
                _, snap = await call(s, "GET", base + "/snapshot")
                return bool(snap["groups"][0]["leader"] == to)
            await wait_until(shown, 20, f"the snapshot to show {to} leading")
    asyncio.run(main())


@pytest.mark.parametrize("method, path, body, says", [
    ("POST", "/leader-transfer", {"group": "a", "to": "n9"}, "group a has no registered node 'n9'"),
    ("POST", "/leader-transfer", {"group": "zz", "to": "n1"}, "no broker group zz is registered"),
    ("POST", "/topics", {"mode": "update", "name": "never-made", "perm": 4},
     "group a has no topic 'never-made'"),
    ("POST", "/reset-offset", {"consumer_group": "g", "topic": "never-made", "to": "earliest"},
     "no broker group serves topic 'never-made'"),
    ("GET", "/messages/not-an-id", None, "not an offset msg id"),
    ("GET", "/messages/a-00000000000FFFFF-0", None, ""),
    ("GET", "/topics?topic=never-made", None, "no broker group serves topic 'never-made'"),
])
def test_what_the_cluster_does_not_have_is_a_named_404(cluster: str, method: str, path: str,
                                                      body: Any, says: str) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
            status, answer = await call(s, method, f"http://{cluster}/console/api{path}", body)
        assert status == 404, answer
        assert says in answer["error"] and answer["error_type"]
    asyncio.run(main())
