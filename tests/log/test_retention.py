"""Retention an operator can plan (issue 19, item 7): RocketMQ's rules as a pure policy (by count,
by age at the deletion hours, by age at any hour past the disk's max used ratio, the oldest
segment forcibly past the forcible ratio; the last segment never; never past the snapshot, the
applied or durable index, nor what a member lagging less than the bound needs), and the same on
a broker node with a shortened age and with the disk ratios crossed. That a stopped member no
longer holds the others' retention past --retention-lag-entries is shown by
tests/nodes/test_snapshot_live.py (the others retain past its log, then it is sent a snapshot)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.server import BrokerServer
from dledger.node.runtime import NodeConfig
from dledger.storage.retention import RetentionPolicy, SegmentAge, policy_target, retain_target
from protocol.broker_kinds import FOUND, OFFSET_OUT_OF_RANGE
from tests.nodes.test_processes import wait_until

NOW = 1_000_000.0
HOUR = 3600.0
# four segments of 100 entries, written 100, 80, 50 and 1 hours ago; the log ends at 400
SEGMENTS = [SegmentAge(1, NOW - 100 * HOUR), SegmentAge(101, NOW - 80 * HOUR),
            SegmentAge(201, NOW - 50 * HOUR), SegmentAge(301, NOW - 1 * HOUR)]


def target(policy: RetentionPolicy, hour: int = 12, used: float = 0.5) -> int:
    return policy_target(policy, SEGMENTS, 400, NOW, hour, used)


def test_by_count_keeps_at_least_that_many() -> None:
    assert target(RetentionPolicy(keep_entries=150, reserved_hours=None)) == 251


def test_by_age_only_at_the_deletion_hours() -> None:
    policy = RetentionPolicy(reserved_hours=72, delete_hours=(4,))
    assert target(policy, hour=12) == 1  # expired, but not the hour
    assert target(policy, hour=4) == 201  # the two segments older than 72 h go
    assert target(RetentionPolicy(reserved_hours=24, delete_hours=(4, 16)), hour=16) == 301


def test_by_age_at_any_hour_when_the_disk_is_full_enough() -> None:
    policy = RetentionPolicy(reserved_hours=72, delete_hours=(4,), disk_max_used_ratio=0.75)
    assert target(policy, hour=12, used=0.74) == 1
    assert target(policy, hour=12, used=0.80) == 201


def test_past_the_forcible_ratio_the_oldest_goes_expired_or_not() -> None:
    policy = RetentionPolicy(reserved_hours=1000, disk_max_used_ratio=0.75,
                             disk_forcibly_ratio=0.85)
    assert target(policy, used=0.84) == 1
    assert target(policy, used=0.90) == 101  # one segment a round


def test_the_last_segment_is_never_deleted() -> None:
    policy = RetentionPolicy(reserved_hours=0, delete_hours=tuple(range(24)),
                             disk_max_used_ratio=0.0, disk_forcibly_ratio=0.0)
    assert target(policy) == 301
    assert policy_target(policy, SEGMENTS[:1], 100, NOW, 4, 1.0) == 1


def test_the_bounds_no_rule_passes() -> None:
    args = dict(applied_index=390, snapshot_index=250, durable_index=400,
                members_need_index=380, last_index=400, lag_entries=1000)
    assert retain_target(301, **args) == 251  # not past the snapshot
    assert retain_target(301, **{**args, "snapshot_index": 399, "members_need_index": 120}) == 120
    # a member lagging by more than the bound no longer holds retention back
    assert retain_target(301, **{**args, "snapshot_index": 399, "members_need_index": 120,
                                 "lag_entries": 150}) == 250


def test_bad_policies_are_refused() -> None:
    for kw in ({"delete_hours": (24,)}, {"disk_max_used_ratio": 0.9, "disk_forcibly_ratio": 0.8},
               {"keep_entries": 0}, {"reserved_hours": -1.0}):
        with pytest.raises(ValueError):
            RetentionPolicy(**kw)  # type: ignore[arg-type]


# -- on a broker node ---------------------------------------------------------------------------


def _raw(body: bytes) -> list[object]:
    return [[body, "", [], uuid.uuid4().hex, [], int(time.time() * 1000)]]


def retained_on_a_node(tmp_path: Path, **retention: object) -> None:
    """200 messages into one queue of a one-node group with small segments and the retention
    options given: old segments go, the queue's min offset follows, the rest reads on."""
    node = NodeConfig(group="g", node_id="n0", peers={"n0": ("127.0.0.1", 0)},
                      data_dir=str(tmp_path), segment_bytes_max=4096, tick_interval_s=0.02,
                      **retention)  # type: ignore[arg-type]
    server = BrokerServer(BrokerConfig(node, admin_listen=None, checkpoint_interval_s=0.2))

    async def run() -> None:
        await server.start()
        try:
            await wait_until(lambda: server.broker.node.is_leader, 10, "the node to lead")
            for i in range(200):
                await server.broker.sends.send("t", 0, _raw(b"m%03d" % i))

            async def retained() -> bool:
                return (await server.broker.pull("t", 0, 0, 1, 1 << 20, 0, ["*"]))[0] == OFFSET_OUT_OF_RANGE
            await wait_until(retained, 15, "retention to delete old segments")
            store = server.broker.node.store
            # the log began at index 1: old segments went (perhaps already during the sends)
            assert store is not None and store.first_index() > 1
            assert len(store.segment_files()) >= 1
            _, _, lo, hi, _ = await server.broker.pull("t", 0, 0, 1, 1 << 20, 0, ["*"])
            assert 0 < lo < hi == 200
            status, nxt, _, _, rows = await server.broker.pull("t", 0, lo, 500, 1 << 20, 0, ["*"])
            assert status == FOUND and nxt == 200  # what is retained reads on from the new min
            assert [r[0] for r in rows] == list(range(lo, 200))
            assert [r[1] for r in rows] == [b"m%03d" % i for i in range(lo, 200)]
        finally:
            await server.stop()

    asyncio.run(run())


def test_segments_older_than_a_shortened_age_go_at_the_deletion_hour(tmp_path: Path) -> None:
    retained_on_a_node(tmp_path, file_reserved_hours=1 / 3600,
                        delete_hours=(time.localtime().tm_hour, (time.localtime().tm_hour + 1) % 24))


def test_past_the_disk_ratio_expired_segments_go_at_any_hour(tmp_path: Path) -> None:
    other_hour = (time.localtime().tm_hour + 12) % 24
    retained_on_a_node(tmp_path, file_reserved_hours=1 / 3600, delete_hours=(other_hour,),
                        disk_max_used_ratio=0.0, disk_forcibly_ratio=1.0)


def test_past_the_forcible_ratio_segments_go_unexpired(tmp_path: Path) -> None:
    retained_on_a_node(tmp_path, file_reserved_hours=72.0, disk_max_used_ratio=0.0,
                        disk_forcibly_ratio=0.0)
