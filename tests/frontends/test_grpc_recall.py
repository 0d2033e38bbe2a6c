"""RecallMessage (issue 35, item 3, and the bar's "a recalled delayed message is never delivered"),
with the unmodified PyPI client 5.1.2's ``Producer.recall_message``: a DELAY message's receipt
carries a recall handle; a message recalled before its time is never delivered, neither one
recalled before a leader is killed (SIGKILL: the recall is a log entry, so the new leader knows
it) nor one recalled after, with a handle another node issued; a recall after delivery is refused
by name (NOT_RECALLABLE), as are a forged or altered handle and one for another topic."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from rocketmq import Message as RmqMessage
from rocketmq import Producer as RmqProducer

from dledger.client import LogClient
from tests.broker.test_broker_processes import _wait_leader
from tests.clusters import namesrv_group
from tests.frontends.endpoints import grpc_endpoints
from tests.frontends.grpc_helpers import (
    answered,
    read_all,
    receive_until,
    rmq_producer,
    simple_consumer,
)
from tests.frontends.raw import statuses
from tests.frontends.test_grpc_failover import wait_for

pytestmark = pytest.mark.slow

TOPIC = "later"
DUE_IN_MS = 12_000  # time for a leader kill and an election before the messages are due


def delayed(body: bytes, due_ms: int) -> RmqMessage:
    m = RmqMessage()
    m.topic, m.body = TOPIC, body
    m.delivery_timestamp = due_ms  # (the client's unit: ms)
    return m


def recall_until(producer: RmqProducer, handle: str, timeout_s: float) -> str:
    """The recall, tried again while the group has no leader (its nodes answer so, or the
    client's node is the one killed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return str(producer.recall_message(TOPIC, handle))
        except Exception as err:  # no leader yet: not a refusal of the recall
            if time.monotonic() > deadline or "NOT_RECALLABLE" in str(err) \
                    or "forged" in str(err):
                raise


def nothing_pending(ns: str) -> bool:
    leaders = [s for s in statuses(ns).values() if s["raft"]["role"] == "leader"]
    return bool(leaders) and all(s["timers"]["pending"] == 0 for s in leaders)


def refused(producer: RmqProducer, handle: str, topic: str, text: str) -> None:
    with pytest.raises(Exception, match=text):
        producer.recall_message(topic, handle)


def test_a_recalled_delayed_message_is_never_delivered_across_a_leader_kill(
        tmp_path: Path) -> None:
    with namesrv_group(tmp_path, "--grpc-listen", "127.0.0.1:0") as (ns, cluster):
        wait_for(lambda: grpc_endpoints(ns).count(";") == 2, 30, "the gRPC endpoints")
        endpoints = grpc_endpoints(ns)
        producer = rmq_producer(endpoints, [TOPIC])
        consumer = simple_consumer(endpoints, "recall-group", TOPIC, await_s=1)
        try:
            due_ms = int(time.time() * 1000) + DUE_IN_MS
            sent: dict[str, Any] = {name: producer.send(delayed(name.encode(), due_ms))
                                    for name in ("before-kill", "after-kill", "kept")}
            assert all(r.recall_handle for r in sent.values())
            early = sent["before-kill"]
            assert producer.recall_message(TOPIC, early.recall_handle) == early.message_id

            async def leader() -> str:
                async with LogClient(cluster.client_addresses, timeout_s=5) as client:
                    return await _wait_leader(client, cluster)
            cluster.kill(asyncio.run(leader()), signal.SIGKILL)
            late = sent["after-kill"]  # its handle checked by another node, the new leader
            assert recall_until(producer, late.recall_handle, 10) == late.message_id
            assert time.time() * 1000 < due_ms, "recalled too late to prove anything: slow box"

            got = receive_until(consumer, 1, invisible_s=10, timeout_s=60)
            assert [m.body for m in got] == [b"kept"]
            answered(lambda: consumer.ack(got[0]))
            wait_for(lambda: nothing_pending(ns), 30, "every timer delivered or recalled")
            assert answered(lambda: consumer.receive(16, 5)) == []  # the recalled ones never come
            stored = asyncio.run(read_all(ns, TOPIC, 1))
            assert [m.body for m in stored] == [b"kept"]  # in no queue at all

            # refused by name: after delivery, forged, altered, for another topic
            refused(producer, sent["kept"].recall_handle, TOPIC, "NOT_RECALLABLE")
            refused(producer, early.recall_handle, TOPIC, "NOT_RECALLABLE")  # recalled already
            handle = sent["kept"].recall_handle
            text, _, mac = handle.rpartition(".")
            altered = f"{text}.{mac[:-1]}{'A' if mac[-1] != 'A' else 'B'}"
            refused(producer, altered, TOPIC, "forged or altered")
            refused(producer, handle, "another-topic", "forged or altered")
            refused(producer, "a-0000000000001000-0", TOPIC, "unsigned")
        finally:
            consumer.shutdown()
            producer.shutdown()
