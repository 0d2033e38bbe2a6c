"""FIFO per message group under RocketMQ 5 clients (issue 35, item 1 and its bar): two message
groups in one queue, one slow SimpleConsumer each (two members of one consumer group, each
holding one message at a time), the unmodified PyPI Producer sending the groups' messages in
runs. Both groups must progress at once, each in order, never two of one group in flight, also
across a leader kill (SIGKILL in the middle). The history is judged by
``chaos.live.checkers.pop`` (FIFO's overlap and order, and the pop checks: nothing lost, no
message back after its ack); its parallel deliveries (a message handed out while one of the
other group was in flight) must come both before and after the kill.

The canary ``fifo_group_overlap`` (a group's next message handed out while its previous one is
in flight) must be caught by the same checker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rocketmq import ClientConfiguration, Credentials
from rocketmq import Message as RmqMessage
from rocketmq import Producer as RmqProducer

from chaos.live.checkers.pop import PopVerdict, check_pop
from dledger.localcluster import LocalCluster
from tests.clusters import namesrv_group
from tests.frontends.endpoints import grpc_endpoints
from tests.frontends.grpc_helpers import started
from tests.frontends.test_grpc_failover import History, consume, kill_the_leader, wait_for

pytestmark = pytest.mark.slow

TOPIC = "fifo-groups"
GROUPS = ("A", "B")
RUN = 3  # messages of one group sent in a row: A A A B B B A A A ...
INVISIBLE_S = 5
PROCESS_S = 0.2  # each consumer's work on a message (the slow consumer), before its ack
BACKLOG = 12  # the producer keeps at most this many messages sent and not yet acked
BROKER_ARGS = ("--grpc-listen", "127.0.0.1:0", "--default-queues", "1")  # one queue: both groups


def produce(endpoints: str, h: History, count: int | None) -> None:
    """The groups' messages in runs, each body ``<group>-<seq>``, one sync send at a time (a
    group's order is its send order), at most ``BACKLOG`` ahead of the acks (the consumers are
    slow); until ``count`` are sent, or until told to stop."""
    producer = started(lambda: RmqProducer(ClientConfiguration(endpoints, Credentials()), [TOPIC]))
    try:
        k = 0
        while not h.stop_sending.is_set() and (count is None or k < count):
            with h.acked:  # (a condition with a deadline: the loop looks at the stop again)
                room = h.acked.wait_for(lambda: len(h.sent) - h.acked_ok() < BACKLOG, 1.0)
            if not room:
                continue
            group = GROUPS[(k // RUN) % len(GROUPS)]
            m = RmqMessage()
            m.topic, m.message_group = TOPIC, group
            m.body = f"{group}-{k:06d}".encode()
            k += 1
            try:
                receipt = producer.send(m)
            except Exception:  # an outcome unknown: not counted as sent (it may still come)
                continue
            with h.lock:
                h.sent.add(receipt.message_id)
    finally:
        producer.shutdown()


def fifo_of(h: History) -> Callable[[Any], tuple[str, int]]:
    """A received message's group and place in its group's send order, from its body (and a
    note of any message whose group the broker gave differently)."""
    def of(m: Any) -> tuple[str, int]:
        group, seq = m.body.decode().split("-")
        if group != m.message_group:
            h.errors.append(f"{m.body!r} came with the group {m.message_group!r}")
        return group, int(seq)
    return of


def acked(h: History) -> int:
    with h.lock:
        return h.acked_ok()


def run_fifo(ns: str, cluster: LocalCluster, kill_leader: bool,
             count: int | None) -> tuple[PopVerdict, float]:
    """The history of one run and the checker's verdict; the time of the kill (or of the
    end, without one)."""
    endpoints = grpc_endpoints(ns)
    h = History()
    producer = threading.Thread(target=produce, args=(endpoints, h, count), daemon=True)
    consumers = [threading.Thread(target=consume, args=(endpoints, h, "fifo-groups-group", TOPIC,
                                                        1, INVISIBLE_S, PROCESS_S, fifo_of(h)),
                                  daemon=True) for _ in range(2)]
    for t in (producer, *consumers):
        t.start()
    wait_for(lambda: acked(h) >= 30, 90, "the first acks")
    killed_s = time.monotonic()
    if kill_leader:
        kill_the_leader(cluster)
        killed_s = time.monotonic()
        at_kill = acked(h)
        wait_for(lambda: acked(h) >= at_kill + 30, 90, "acks after the leader's death")
    h.stop_sending.set()
    producer.join(60)
    wait_for(h.all_acked, 90, "every acknowledged send received and acked")
    h.stop_receiving.set()
    for t in consumers:
        t.join(30)
    with h.lock:
        assert not h.errors, h.errors
        verdict = check_pop(set(h.sent), list(h.deliveries), list(h.acks))
    print(f"sent {verdict.sent}, received {verdict.received}, redelivered "
          f"{verdict.redelivered}, acks {len(h.acks)}, parallel {len(verdict.parallel_s)}")
    return verdict, killed_s


def test_two_message_groups_of_one_queue_progress_at_once_in_order_across_a_leader_kill(
        tmp_path: Path) -> None:
    with namesrv_group(tmp_path, *BROKER_ARGS) as (ns, cluster):
        wait_for(lambda: grpc_endpoints(ns).count(";") == 2, 30, "the gRPC endpoints")
        verdict, killed_s = run_fifo(ns, cluster, kill_leader=True, count=None)
    assert verdict.ok, verdict.lines()
    before = [t for t in verdict.parallel_s if t < killed_s]
    after = [t for t in verdict.parallel_s if t > killed_s]
    assert len(before) >= 5 and len(after) >= 5, \
        f"the groups did not progress at once: {len(before)} before the kill, {len(after)} after"


def test_the_checker_catches_a_group_handed_out_twice_at_once(tmp_path: Path) -> None:
    with namesrv_group(tmp_path, *BROKER_ARGS, "--test-faults", "--broker-canary",
                       "fifo_group_overlap") as (ns, cluster):
        wait_for(lambda: grpc_endpoints(ns).count(";") == 2, 30, "the gRPC endpoints")
        verdict, _ = run_fifo(ns, cluster, kill_leader=False, count=60)
    assert verdict.overlap, "the seeded bug went unnoticed"
    assert not verdict.lost and not verdict.after_ack
