"""Log retention and the consume queues: once old segments are deleted, a queue's min offset moves
past the messages they held; a pull below it is answered OFFSET_OUT_OF_RANGE with the new min,
and pulls from the min go on. One in-process broker node (a group of one)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

from broker.protocol import FOUND, OFFSET_OUT_OF_RANGE
from broker.server import BrokerConfig, BrokerServer
from dledger.runtime import NodeConfig
from tests.test_processes import wait_until


def _raw(body: bytes) -> list[object]:
    return [[body, "", [], uuid.uuid4().hex, [], int(time.time() * 1000)]]


def test_retention_moves_a_queues_min_offset(tmp_path: Path) -> None:
    node = NodeConfig(group="g", node_id="n0", peers={"n0": ("127.0.0.1", 0)},
                      data_dir=str(tmp_path), segment_bytes_max=4096, retention_entries=20,
                      tick_interval_s=0.02)
    server = BrokerServer(BrokerConfig(node, admin_listen=None, checkpoint_interval_s=0.2))

    async def run() -> None:
        await server.start()
        try:
            await wait_until(lambda: server.node.is_leader, 10, "the node to lead")
            for i in range(200):
                await server.send("t", 0, _raw(b"m%03d" % i))

            async def retained() -> bool:
                return (await server.pull("t", 0, 0, 1, 1 << 20, 0, ["*"]))[0] == OFFSET_OUT_OF_RANGE
            await wait_until(retained, 15, "retention to delete old segments")
            status, _, lo, hi, _ = await server.pull("t", 0, 0, 1, 1 << 20, 0, ["*"])
            assert 0 < lo < hi == 200
            status, nxt, _, _, rows = await server.pull("t", 0, lo, 500, 1 << 20, 0, ["*"])
            assert status == FOUND and nxt == 200
            assert [r[0] for r in rows] == list(range(lo, 200))
            assert [r[1] for r in rows] == [b"m%03d" % i for i in range(lo, 200)]
        finally:
            await server.stop()

    asyncio.run(run())
