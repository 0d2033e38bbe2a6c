"""What the NameServer's remoting route for ``TBW102`` (a 4.x producer's stand-in for a topic
not created yet) offers: the groups whose first send creates a topic, each with the queues it
would create (its broker's --default-queues, registered as ``auto_create_queues``); not a group
that creates none; a group whose broker does not say, with the 4 queues of before."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

from namesrv.registry import Registry
from namesrv.remoting import DEFAULT_QUEUES, route_body
from protocol.remoting import codes
from tests.clusters import namesrv_group
from tests.namesrv.test_namesrv_registry import reg
from tests.nodes.test_processes import wait_until
from tests.remoting.raw import RawRemoting


def _routes(auto_create: dict[str, int | None]) -> dict[str, int]:
    r = Registry(lease_s=10.0)
    for port, (group, queues) in enumerate(auto_create.items()):
        lone = reg("n0", "leader", 3, group=group, members=("n0",), port=10911 + 100 * port)
        r.register(replace(lone, remoting_address=f"127.0.0.1:{20911 + port}",
                           auto_create_queues=queues), now_s=0.0)
    body = route_body(r, codes.AUTO_CREATE_TOPIC, 0.0)
    if body is None:
        return {}
    assert [b["brokerName"] for b in body["brokerDatas"]] == \
        [q["brokerName"] for q in body["queueDatas"]]
    out = {}
    for q in body["queueDatas"]:
        assert q["readQueueNums"] == q["writeQueueNums"]
        out[q["brokerName"]] = q["readQueueNums"]
    return out


def test_tbw102_offers_each_group_that_creates_topics_with_the_queues_it_creates() -> None:
    assert _routes({"a": 2, "b": 0, "c": None, "d": 16}) == {"a": 2, "c": DEFAULT_QUEUES,
                                                              "d": 16}


def test_the_cluster_view_shows_what_each_group_creates() -> None:
    r = Registry(lease_s=10.0)
    for port, (group, queues) in enumerate({"a": 2, "b": 0, "c": None}.items()):
        lone = reg("n0", "leader", 3, group=group, members=("n0",), port=10911 + 100 * port)
        r.register(replace(lone, auto_create_queues=queues), now_s=0.0)
    view = {g["group"]: g["auto_create_queues"] for g in (v.to_json() for v in r.cluster(0.0))}
    assert view == {"a": 2, "b": 0, "c": None}  # (None: a broker that did not say)


def test_no_group_that_creates_topics_leaves_tbw102_unrouted() -> None:
    assert _routes({"a": 0, "b": 0}) == {}


def test_tbw102_offers_the_queues_a_first_send_creates(tmp_path: Path) -> None:
    """A group whose brokers create 2 queues for a new topic is offered under TBW102 with 2, so
    that a 4.x producer never picks a queue the topic will not have."""
    with namesrv_group(tmp_path, "--remoting-listen", "127.0.0.1:0",
                       "--default-queues", "2") as (address, _):
        async def offered() -> bool:
            async with RawRemoting(address) as c:
                answer = await c.call(codes.GET_ROUTEINFO_BY_TOPIC,
                                      {"topic": codes.AUTO_CREATE_TOPIC})
            if answer.code != codes.SUCCESS:
                return False
            [queues] = json.loads(answer.body)["queueDatas"]
            assert (queues["readQueueNums"], queues["writeQueueNums"]) == (2, 2), queues
            return True
        asyncio.run(wait_until(offered, 30, "the group under TBW102"))
