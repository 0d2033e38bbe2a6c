"""A pop consumer group behind log retention (which follows the entry count and age, not
consumers): its receives go on from the first message the log still holds, and a popped message
that retention deleted before its ack is acknowledged when due again (nothing is left to hand
out), the rest handed out. Before, every receive of such a group was refused (the leader planned
from the retained offset, which the apply, identical on every replica, cannot know: "a pop from
169 while the cursor is at 1"), and a due message whose segment was gone failed the receive after
its pop was committed. One in-process broker node with small segments, as
``tests/log/test_retention.py``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from broker.config import BrokerConfig
from broker.server import BrokerServer
from dledger.node.runtime import NodeConfig
from protocol.broker_kinds import OFFSET_OUT_OF_RANGE
from tests.log.test_retention import _raw
from tests.nodes.test_processes import wait_until

GROUP, TOPIC = "slow-reader", "t"


def test_a_popped_message_deleted_by_retention_is_acknowledged_when_due_again(
        tmp_path: Path) -> None:
    node = NodeConfig(group="g", node_id="n0", peers={"n0": ("127.0.0.1", 0)},
                      data_dir=str(tmp_path), segment_bytes_max=4096, tick_interval_s=0.02,
                      retention_entries=20)
    server = BrokerServer(BrokerConfig(node, admin_listen=None, checkpoint_interval_s=0.2))

    async def run() -> None:
        await server.start()
        try:
            broker = server.broker
            await wait_until(lambda: broker.node.is_leader, 10, "the node to lead")
            await broker.sends.send(TOPIC, 0, _raw(b"first"))
            (row,) = await broker.pops.receive(GROUP, TOPIC, 0, 1, 1_000, ["*"], None, 0, 16)
            assert row[1] == 0 and row[2] == b"first"  # handed out, never acknowledged
            for i in range(200):
                await broker.sends.send(TOPIC, 0, _raw(b"m%03d" % i))

            async def retained() -> bool:
                return (await broker.pull(TOPIC, 0, 0, 1, 1 << 20, 0, ["*"]))[0] \
                    == OFFSET_OUT_OF_RANGE
            await wait_until(retained, 15, "retention to delete the popped message's segment")
            key = (GROUP, TOPIC, 0)
            await wait_until(lambda: broker.state.pops.due(key, int(time.time() * 1000)),
                             10, "the popped message to be due again")
            rows = await broker.pops.receive(GROUP, TOPIC, 0, 8, 60_000, ["*"], None, 0, 16)
            assert rows and all(r[1] > 0 for r in rows), rows  # the retained ones, not offset 0
            q = broker.state.pops.get(key)
            assert q is not None and 0 not in q.inflight  # acknowledged: it left flight
        finally:
            await server.stop()

    asyncio.run(run())
