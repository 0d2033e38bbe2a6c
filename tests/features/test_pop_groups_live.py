"""The leader's planning of FIFO per message group (``broker.features.pop.service``), through raw
POP_RECEIVE and POP_ACK requests to a one-node broker process: a receive scans past a long run
of a busy group's messages (held back, more than one scan's worth) to another group's, releases
a held-back message once its group's previous one is acknowledged, and never hands out two of
one group at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dledger.client import LogClient
from protocol import broker_kinds as bp
from protocol.consume_rules import MESSAGE_GROUP_PROPERTY
from tests.broker.test_broker_requests import run

pytestmark = pytest.mark.slow

RUN_OF_A = 1500  # more than one scan examines (SCAN_UNITS_MAX), fewer than may be held back


def grouped(body: str, group: str) -> list[Any]:
    return [body.encode(), "", [], "", [[MESSAGE_GROUP_PROPERTY, group]], 0]


async def receive(client: LogClient, max_messages: int) -> list[tuple[str, int, int]]:
    """(body, queue offset, epoch) of each message one receive hands out (no long poll)."""
    rows = await client.call("n0", bp.POP_RECEIVE, "g", "f", -1, max_messages, 60_000, ["*"],
                             "", 0, 16)
    return [(r[2].decode(), r[1], r[10]) for r in rows]


def test_a_receive_passes_a_busy_groups_run_and_releases_it_in_order(tmp_path: Path) -> None:
    async def scenario(client: LogClient, n0: str) -> None:
        await client.call(n0, bp.TOPIC_PUT, "f", 1, 1, 6)
        run_of_a = [grouped(f"A{i}", "A") for i in range(RUN_OF_A)]
        await client.call(n0, bp.SEND, "f", 0, run_of_a)
        await client.call(n0, bp.SEND, "f", 0, [grouped("B0", "B"), grouped("B1", "B"),
                                                [b"n", "", [], "", [], 0]])
        (a0,) = await receive(client, 1)
        assert a0[0] == "A0"
        # A1.. wait behind A0; B0 is past them all; B1 waits behind B0; the unordered one goes
        got = await receive(client, 32)
        assert [b for b, _, _ in got] == ["B0", "n"]
        assert await receive(client, 32) == []
        b0 = got[0]
        assert await client.call(n0, bp.POP_ACK, "g", "f", 0, [[a0[1], a0[2]]]) == [True]
        assert [b for b, _, _ in await receive(client, 32)] == ["A1"]
        assert await client.call(n0, bp.POP_ACK, "g", "f", 0, [[b0[1], b0[2]]]) == [True]
        assert [b for b, _, _ in await receive(client, 32)] == ["B1"]
        # the group's consume offset is its lowest message in flight or held back
        status = await client.call(n0, bp.CONSUMER_STATUS, "g")
        assert status["queues"] == [["f", 0, 1, RUN_OF_A + 3]]

    run(tmp_path, scenario)
