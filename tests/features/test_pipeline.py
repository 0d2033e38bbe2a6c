"""Exactly-once consume-transform-produce (issue 18 item 7): a pipeline process reads 10,000
messages and writes one output per input, in transactions that commit its outputs and its
consumer offset together; it is killed (SIGKILL, by PID) three times and the group's leader
twice while it works, and restarted each time. In the end there are exactly 10,000 outputs,
one per input, and the group's offsets are at the end of every input queue."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from client import Message, Producer, PullConsumer
from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from protocol import broker_kinds as bp
from tests.broker.test_broker_processes import _wait_leader
from tests.clusters import namesrv_group, namesrv_groups
from tests.nodes.test_processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]
INPUTS = 10_000
FAST_CHECKS = ("--transaction-timeout-s", "1", "--transaction-check-interval-s", "0.5")

PIPELINE = """
import asyncio, sys
from client import Message
from client.producer.pipeline import Pipeline

async def main(ns, source, target):
    def transform(m):
        return [Message(target, b"out:" + m.body, keys=[m.msg_id])]
    async with Pipeline(ns, "pipe", source, transform, timeout_s=5.0) as p:
        print("started", flush=True)
        await p.run(asyncio.Event())  # until killed

asyncio.run(main(*sys.argv[1:]))
"""


async def queue_totals(c: PullConsumer, topic: str) -> int:
    try:
        queues = await c.fetch_queues(topic, wait=False)
    except Exception:  # not created yet: nothing there
        return 0
    return sum([(await c.pull(mq, 0, 0)).max_offset for mq in queues])


async def all_bodies(c: PullConsumer, topic: str) -> list[bytes]:
    out: list[bytes] = []
    for mq in await c.fetch_queues(topic):
        offset = 0
        while True:
            r = await c.pull(mq, offset, 1024)
            if not r.messages:
                break
            out += [m.body for m in r.messages]
            offset = r.next_offset
    return out


async def caught_up(ns: str, topic: str) -> bool:
    """Whether the pipeline's group has committed every queue of ``topic`` to its end."""
    async with PullConsumer(ns, "pipe") as pc:
        queues = await pc.fetch_queues(topic)
        return all([await pc.committed(mq) == (await pc.pull(mq, 0, 0)).max_offset
                    for mq in queues])


async def send_inputs(ns: str, topic: str, count: int) -> None:
    async with Producer(ns, send_timeout_s=10.0) as p:
        for start in range(0, count, 500):
            await asyncio.gather(*(p.send(Message(topic, f"i{k}".encode()))
                                   for k in range(start, min(count, start + 500))))


class PipelineProcess:
    def __init__(self, ns: str, source: str = "pin", target: str = "pout") -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", PIPELINE, ns, source, target], cwd=ROOT,
                                     stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})

    async def started(self) -> None:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), 60)
        assert line.strip() == "started", line

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def test_a_pipeline_killed_again_and_again_makes_one_output_per_input(tmp_path: Path) -> None:
    async def scenario(ns: str, cluster: LocalCluster) -> None:
        await send_inputs(ns, "pin", INPUTS)
        client = LogClient(cluster.client_addresses)
        pipeline = PipelineProcess(ns)
        await pipeline.started()
        kills = {1500: "pipeline", 3000: "leader", 4500: "pipeline", 6000: "leader",
                 7500: "pipeline"}
        async with PullConsumer(ns, "checker") as c:
            try:
                for at, what in sorted(kills.items()):
                    async def reached(at: int = at) -> bool:
                        return await queue_totals(c, "pout") >= at
                    await wait_until(reached, 90, f"{at} outputs")
                    if what == "pipeline":
                        pipeline.kill()  # mid-transaction, as likely as not
                        pipeline = PipelineProcess(ns)
                        await pipeline.started()
                    else:
                        leader = await _wait_leader(client, cluster)
                        cluster.kill(leader)
                        await _wait_leader(client, cluster)
                        cluster.restart(leader)

                await wait_until(lambda: caught_up(ns, "pin"), 120,
                                 "the pipeline's offsets at the end of its input")
            finally:
                pipeline.kill()
            outputs = Counter(await all_bodies(c, "pout"))
        await client.close()
        assert sum(outputs.values()) == INPUTS, (sum(outputs.values()), outputs.most_common(3))
        assert outputs == Counter(f"out:i{k}".encode() for k in range(INPUTS))

    with namesrv_group(tmp_path, *FAST_CHECKS) as (ns, cluster):
        asyncio.run(scenario(ns, cluster))


CROSS_INPUTS = 2_000


def test_a_pipeline_into_another_broker_group_repeats_no_output(tmp_path: Path) -> None:
    """Input in group a, output topic served by group b only: the outputs cannot join a's
    transaction; sent under keys derived from their inputs, the repeats after each kill are
    stored once by b (within its dedup window), so again one output per input."""
    async def scenario(ns: str, clusters: dict[str, LocalCluster]) -> None:
        for name, topic in (("a", "xin"), ("b", "xout")):
            async with LogClient(clusters[name].client_addresses) as control:
                await control.call_leader(bp.TOPIC_PUT, topic, 4, 4, 6, timeout_s=10.0)
        async with PullConsumer(ns, "checker") as c:
            async def served(topic: str, group: str) -> bool:
                return [g.group for g in await c.groups(topic)] == [group]
            for topic, group in (("xin", "a"), ("xout", "b")):
                await wait_until(lambda topic=topic, group=group: served(topic, group), 30,
                                 f"{topic} routed to {group}")
            await send_inputs(ns, "xin", CROSS_INPUTS)
            pipeline = PipelineProcess(ns, "xin", "xout")
            await pipeline.started()
            try:
                for at in (400, 900, 1400):
                    async def reached(at: int = at) -> bool:
                        return await queue_totals(c, "xout") >= at
                    await wait_until(reached, 90, f"{at} outputs")
                    pipeline.kill()
                    pipeline = PipelineProcess(ns, "xin", "xout")
                    await pipeline.started()
                await wait_until(lambda: caught_up(ns, "xin"), 120,
                                 "the pipeline's offsets at the end of its input")
            finally:
                pipeline.kill()
            outputs = Counter(await all_bodies(c, "xout"))
        assert outputs == Counter(f"out:i{k}".encode() for k in range(CROSS_INPUTS))

    with namesrv_groups(tmp_path, *FAST_CHECKS) as (ns, clusters):
        asyncio.run(scenario(ns, clusters))
