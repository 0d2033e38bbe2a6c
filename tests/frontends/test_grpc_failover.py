"""A leader kill under RocketMQ 5 clients (issue 20, item 3): the unmodified PyPI Producer sends
steadily and a SimpleConsumer receives and acks through the gRPC endpoints of a 3-node group;
the leader is killed (SIGKILL) in the middle. The clients carry on with the endpoints they were
given; the history is judged by ``chaos.live.checkers.pop``: no acknowledged send lost, no
message received after its ack was acknowledged (redeliveries of unacked messages are counted).
The canary ``pop_ack_lost`` (an ack answered but not applied) must be caught by the same check.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer
from rocketmq import Message as RmqMessage
from rocketmq import Producer as RmqProducer

from chaos.live.checkers.pop import Ack, Delivery, PopVerdict, check_pop
from chaos.live.grpc_clients import ack_timed
from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from tests.broker.test_broker_processes import _wait_leader
from tests.clusters import namesrv_group
from tests.frontends.endpoints import grpc_endpoints
from tests.frontends.grpc_helpers import started

pytestmark = pytest.mark.slow

TOPIC = "failover"
INVISIBLE_S = 2


class History:
    """What the client threads saw, for the checker."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked = threading.Condition(self.lock)  # notified at each ack answered
        self.sent: set[str] = set()
        self.send_failures = 0
        self.deliveries: list[Delivery] = []
        self.acks: list[Ack] = []  # (refused or unanswered ones too: ok False)
        self.ack_failures = 0
        self.stop_sending = threading.Event()
        self.stop_receiving = threading.Event()
        self.errors: list[str] = []

    def received_all(self) -> bool:
        with self.lock:
            return self.sent <= {d.message_id for d in self.deliveries}

    def acked_ok(self) -> int:
        """Messages whose ack the broker acknowledged (the caller holds the lock)."""
        return len({a.message_id for a in self.acks if a.ok})

    def all_acked(self) -> bool:
        with self.lock:
            return self.sent <= {a.message_id for a in self.acks if a.ok}


def produce(endpoints: str, h: History) -> None:
    producer = started(lambda: RmqProducer(ClientConfiguration(endpoints, Credentials()), [TOPIC]))
    try:
        k = 0
        while not h.stop_sending.is_set():
            m = RmqMessage()
            m.topic, m.body = TOPIC, b"m%06d" % k
            k += 1
            try:
                receipt = producer.send(m)
            except Exception:  # an outcome unknown: not counted as sent
                with h.lock:
                    h.send_failures += 1
                continue
            with h.lock:
                h.sent.add(receipt.message_id)
    finally:
        producer.shutdown()


def consume(endpoints: str, h: History, group: str = "failover-group", topic: str = TOPIC,
            batch: int = 32, invisible_s: int = INVISIBLE_S, process_s: float = 0.0,
            fifo: Callable[[Any], tuple[str, int]] | None = None) -> None:
    """A member of ``group``: receives up to ``batch`` messages, works ``process_s`` on each,
    acks it; every receive's start and end and every ack's sending, answer and outcome
    recorded. ``fifo`` gives a message's group and its place in the group's send order."""
    consumer = started(lambda: SimpleConsumer(ClientConfiguration(endpoints, Credentials()), group,
                                              {topic: FilterExpression()}, await_duration=1))
    try:
        while not h.stop_receiving.is_set():
            began = time.monotonic()
            try:
                messages = consumer.receive(batch, invisible_s)
            except Exception:  # a receive under the fault: try again
                continue
            ended = time.monotonic()
            with h.lock:
                h.deliveries += [Delivery(m.message_id, began, m.delivery_attempt or 1, ended,
                                          *(fifo(m) if fifo is not None else ("", -1)))
                                 for m in messages]
            for m in messages:
                if process_s:
                    h.stop_receiving.wait(process_s)  # the consumer's work on it
                ack = ack_timed(consumer, m)
                with h.acked:
                    h.ack_failures += not ack.ok
                    h.acks.append(ack)
                    h.acked.notify_all()
    finally:
        consumer.shutdown()


def wait_for(pred: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # (client threads do the work: polling their record with a deadline)


def kill_the_leader(cluster: LocalCluster) -> str:
    """SIGKILL the group's leader (once there is one); its node id."""
    async def leader() -> str:
        async with LogClient(cluster.client_addresses, timeout_s=5) as client:
            return await _wait_leader(client, cluster)
    victim = asyncio.run(leader())
    cluster.kill(victim, signal.SIGKILL)
    return victim


def run_history(ns: str, cluster: LocalCluster, kill_leader: bool, drain_s: float) -> PopVerdict:
    endpoints = grpc_endpoints(ns)
    h = History()
    threads = [threading.Thread(target=produce, args=(endpoints, h), daemon=True),
               threading.Thread(target=consume, args=(endpoints, h), daemon=True)]
    for t in threads:
        t.start()
    wait_for(lambda: len(h.sent) >= 50 and len(h.acks) >= 20, 60, "the first sends and acks")
    if kill_leader:
        kill_the_leader(cluster)
        at_kill = len(h.sent)
        wait_for(lambda: len(h.sent) >= at_kill + 50, 60, "sends after the leader's death")
    h.stop_sending.set()
    threads[0].join(30)
    wait_for(h.received_all, 60, "every acknowledged send received")
    time.sleep(drain_s)  # the measured window in which acked messages must not come back
    h.stop_receiving.set()
    threads[1].join(30)
    verdict = check_pop(h.sent, h.deliveries, h.acks)
    print(f"sent {verdict.sent} (failed {h.send_failures}), received {verdict.received}, "
          f"redelivered {verdict.redelivered}, acks {len(h.acks) - h.ack_failures} (failed "
          f"{h.ack_failures})")
    return verdict


def test_a_leader_kill_under_rocketmq_clients_loses_nothing_and_redelivers_no_acked_message(
        tmp_path: Path) -> None:
    with namesrv_group(tmp_path, "--grpc-listen", "127.0.0.1:0") as (ns, cluster):
        wait_for(lambda: grpc_endpoints(ns).count(";") == 2, 30, "the gRPC endpoints")
        verdict = run_history(ns, cluster, kill_leader=True, drain_s=INVISIBLE_S + 1)
    assert verdict.ok, verdict.lines()


def test_the_checker_catches_an_ack_that_is_answered_but_not_applied(tmp_path: Path) -> None:
    with namesrv_group(tmp_path, "--grpc-listen", "127.0.0.1:0", "--test-faults",
                       "--broker-canary", "pop_ack_lost") as (ns, cluster):
        wait_for(lambda: grpc_endpoints(ns).count(";") == 2, 30, "the gRPC endpoints")
        verdict = run_history(ns, cluster, kill_leader=False, drain_s=INVISIBLE_S + 1)
    assert verdict.after_ack, "the seeded bug went unnoticed"
    assert not verdict.lost
