"""A group's leader SIGKILLed while a RocketMQ 4.x producer (the C++ client) sends to two groups:
no acknowledged message is lost, and the sends that failed are counted and reported (the aim is
none: the client retries a failed send on its next queue, the route is refreshed every 30 s)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from client import LitePullConsumer, ReceivedMessage
from protocol.remoting import codes
from tests.clusters import namesrv_groups
from tests.nodes.test_processes import wait_until
from tests.remoting.clients import cpp, cpp_python, finish, read_until
from tests.remoting.raw import RawRemoting

COUNT = 400
KILL_AFTER = 80


async def _leader_addr(ns: str, group: str) -> str:
    async with RawRemoting(ns) as c:
        info = json.loads((await c.call(codes.GET_BROKER_CLUSTER_INFO)).body)
    return str(info["brokerAddrTable"].get(group, {}).get("brokerAddrs", {}).get("0", ""))


async def _two_leaders(ns: str) -> None:
    async def led() -> bool:
        return bool(await _leader_addr(ns, "a")) and bool(await _leader_addr(ns, "b"))
    await wait_until(led, 30, "both groups' leaders registered")


async def _both_groups(ns: str) -> None:
    async def routed() -> bool:
        async with RawRemoting(ns) as c:
            answer = await c.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "cpp-failover"})
        return answer.code == codes.SUCCESS and len(json.loads(answer.body)["brokerDatas"]) == 2
    await wait_until(routed, 30, "the topic routed to both groups")


def test_a_leader_kill_loses_no_acknowledged_4x_send(tmp_path: Path) -> None:
    cpp_python()
    with namesrv_groups(tmp_path, "--remoting-listen", "127.0.0.1:0") as (ns, clusters):
        asyncio.run(_two_leaders(ns))
        subprocess.run([sys.executable, "-c", "import cli; cli.main()", "topic", "create",
                        "cpp-failover", "--queues", "4", "--namesrv", ns], check=True,
                       capture_output=True, timeout=60)  # on both groups: half the sends go to a
        asyncio.run(_both_groups(ns))
        producer = cpp(tmp_path / "p", "produce", "--namesrv", ns, "--topic", "cpp-failover",
                       "--count", str(COUNT), "--interval-ms", "20")
        early = read_until(producer, lambda e: e.get("i", 0) >= KILL_AFTER, 60)
        leader = asyncio.run(_leader_addr(ns, "a"))
        victim = next(nid for nid, s in clusters["a"].servers.items()
                      if ":".join(map(str, s.ready.get("remoting", []))) == leader)
        clusters["a"].kill(victim)
        events = early + finish(producer, 120)
        acked = {e["msg_id"] for e in events if e.get("status") == 0}
        assert any(e["i"] > KILL_AFTER + 50 for e in events if "i" in e)  # sends went on
        failed = [e for e in events if "error" in e]
        sys.stderr.write(f"4.x sends during a leader kill: {len(acked)} acknowledged, "
                         f"{len(failed)} failed of {COUNT}\n")
        assert len(acked) + len(failed) == COUNT

        async def all_there() -> None:
            lite = LitePullConsumer(ns, "failover-check", start_from="first")
            lite.subscribe("cpp-failover")
            seen: set[str] = set()
            async with await lite.start():
                async def complete() -> bool:
                    batch: list[ReceivedMessage] = await lite.poll(0.2)
                    seen.update(m.msg_id for m in batch)
                    return acked <= seen
                await wait_until(complete, 60, "every acknowledged 4.x send to be read back")
        asyncio.run(all_there())
