"""Ordered messages (the issue's item 3): the lock table's rules
(``broker.features.orderly.model``), and on real processes 10,000 messages over 1,000 order ids sent
through a queue selector and consumed by two orderly consumers while one consumer restarts and the
leader is killed, and a third member joins right after the kill: each order id's messages are
processed in send order and no two members process one queue at the same instant
(``chaos.live.checkers.orderly`` reads the recorded history). The canaries that grant a held lock
are caught: the member that joins after the kill asks for a queue whose lock the old leader granted,
which only a lock kept as replicated state refuses (the restarted member locked its queues just
before the kill, and renews them only 20 s later; its slow heartbeat keeps it processing them for a
while after the newcomer arrives: the brokers run --no-notify-consumers, so that it learns of the
newcomer at its heartbeat, not at once from their notice, which would leave the canaries' overlap
a few milliseconds wide)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from broker.features.orderly.model import LockTable
from chaos.live.checkers.orderly import Processing, check_orderly
from client import ConsumeStatus, Message, Producer, ReceivedMessage
from client.consumer.orderly import OrderlyPushConsumer
from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from tests.broker.test_broker_processes import BROKER, _start_namesrv, _wait_leader
from tests.nodes.test_processes import wait_until


def test_a_lock_is_exclusive_until_released_or_expired_and_time_never_runs_back() -> None:
    t = LockTable()
    assert t.lock("g", "a", [("t", 0), ("t", 1)], 1000, ttl_ms=100) == [("t", 0), ("t", 1)]
    assert t.lock("g", "b", [("t", 0), ("t", 2)], 1050, ttl_ms=100) == [("t", 2)]
    assert t.lock("h", "b", [("t", 0)], 1050, ttl_ms=100) == [("t", 0)]  # another group
    assert t.lock("g", "a", [("t", 0)], 1090, ttl_ms=100) == [("t", 0)]  # renewed to 1190
    assert t.lock("g", "b", [("t", 0)], 1150, ttl_ms=100) == []
    # a new leader whose clock is behind: the table's time stays at 1150, the lock holds
    assert t.lock("g", "b", [("t", 0)], 500, ttl_ms=100) == [] and t.clock_ms == 1150
    t.unlock("g", "b", [("t", 0)], 1160)  # not b's: nothing happens
    assert t.holder(("g", "t", 0)) == "a"
    t.unlock("g", "a", [("t", 0)], 1160)
    assert t.lock("g", "b", [("t", 0)], 1161, ttl_ms=100) == [("t", 0)]
    assert t.lock("g", "a", [("t", 1)], 1300, ttl_ms=100) == [("t", 1)]  # expired: free again
    assert LockTable.restore(t.snapshot()) == t
    assert t.lock("g", "c", [("t", 0)], 1301, fenced=False) == [("t", 0)]  # the canary


def test_the_checker_names_overlap_disorder_and_loss() -> None:
    ok = [Processing("a", "q0", 0, "o", 0, 0, 10, True), Processing("b", "q0", 1, "o", 1, 10, 20, True)]
    assert check_orderly(ok, {"o": 2}) == []
    overlap = [ok[0], Processing("b", "q0", 1, "o", 1, 5, 20, True)]
    assert [p.split(":")[0] for p in check_orderly(overlap, {"o": 2})] == ["overlap"]
    disorder = [Processing("a", "q0", 1, "o", 1, 0, 10, True), Processing("a", "q0", 0, "o", 0, 10, 20, True)]
    assert [p.split(":")[0] for p in check_orderly(disorder, {"o": 2})] == ["order"]
    assert check_orderly(ok[:1], {"o": 2})[0].startswith("lost: o message 1")
    retried = [Processing("a", "q0", 0, "o", 0, 0, 5, False), *ok]  # in place: fine
    assert check_orderly(retried, {"o": 2}) == []


ORDERS = 1000
PER_ORDER = 10
TOPIC = "orders"


class Recording:
    """The listener: records every call, fails one message in ten once (SUSPEND in place)."""

    def __init__(self, member: str, history: list[Processing]) -> None:
        self.member = member
        self.history = history
        self.failed: set[bytes] = set()

    async def __call__(self, batch: list[ReceivedMessage]) -> ConsumeStatus:
        (m,) = batch
        start = time.monotonic_ns()
        await asyncio.sleep(0.001)  # some work, so that processing intervals have a width
        order_id, seq = m.body.decode().split(":")
        ok = not (int(seq) == 3 and m.body not in self.failed)
        if not ok:
            self.failed.add(m.body)
        self.history.append(Processing(self.member, f"{m.queue.group}/{m.queue.queue_id}",
                                       m.queue_offset, order_id, int(seq), start,
                                       time.monotonic_ns(), ok))
        return ConsumeStatus.SUCCESS if ok else ConsumeStatus.SUSPEND


def consumer(ns: str, member: str, history: list[Processing],
             heartbeat_s: float = 2.0) -> OrderlyPushConsumer:
    c = OrderlyPushConsumer(ns, "orderly", Recording(member, history), client_id=member,
                            suspend_s=0.05, heartbeat_s=heartbeat_s, rebalance_s=heartbeat_s,
                            commit_s=0.3, suspend_ms=300, start_from="first")
    c.subscribe(TOPIC)
    return c


async def scenario(ns: str, cluster: LocalCluster) -> tuple[list[Processing], dict[str, int]]:
    history: list[Processing] = []
    acked: dict[str, int] = {}
    async with Producer(ns, send_timeout_s=15) as producer, \
            LogClient(cluster.client_addresses) as client:
        await producer.send(Message(TOPIC, b"warm:0"))  # creates the topic (4 queues)
        a, b = consumer(ns, "a", history), consumer(ns, "b", history)
        await a.start()
        await b.start()

        async def one_order(k: int) -> None:
            oid = f"o{k}"
            for seq in range(PER_ORDER):  # each send awaited: the key's order is send order
                await producer.send_orderly(Message(TOPIC, f"{oid}:{seq}".encode()), oid)
                acked[oid] = seq + 1

        half = ORDERS // 2  # the first half now, the second once the newcomer joined: so its
        sending = asyncio.gather(*(one_order(k) for k in range(half)))  # queue is busy then
        await wait_until(lambda: len(history) > 1500, 60, "consumption under way")
        await b.close()  # a member leaves and comes back: its queues move and return
        b = consumer(ns, "b", history)
        await b.start()
        await wait_until(lambda: len(b.assigned) == 2 and all(map(b.holds, b.assigned)), 60,
                         "the restarted member holding its queues again")
        cluster.kill(await _wait_leader(client, cluster))
        await _wait_leader(client, cluster)
        c = consumer(ns, "c", history, heartbeat_s=0.3)  # asks at once for one of b's queues
        await c.start()
        sending = asyncio.gather(sending, *(one_order(k) for k in range(half, ORDERS)))
        await wait_until(lambda: len(history) > 6500, 60, "consumption after the kill")
        await sending
        total = sum(acked.values())
        await wait_until(lambda: len({(p.order_id, p.seq) for p in history if p.ok}) >= total,
                         120, "every acknowledged message processed")
        await a.close()
        await b.close()
        await c.close()
    return [p for p in history if p.order_id != "warm"], acked


def run(tmp_path: Path, *canary: str) -> list[str]:
    ns_proc, ns = _start_namesrv(tmp_path)
    extra = ("--test-faults", "--broker-canary", canary[0]) if canary else ()
    try:
        with LocalCluster(str(tmp_path), size=3, tick_ms=50,
                          program=(*BROKER, "--namesrv", ns, "--register-interval-s", "1",
                                   "--no-notify-consumers", *extra)) as cluster:
            history, acked = asyncio.run(scenario(ns, cluster))
        assert sum(acked.values()) == ORDERS * PER_ORDER
        return check_orderly(history, acked)
    finally:
        ns_proc.terminate()
        ns_proc.wait(timeout=10)


@pytest.mark.slow
def test_orders_are_processed_in_send_order_by_one_member_per_queue(tmp_path: Path) -> None:
    assert run(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize("canary", ["lock_unfenced", "lock_leader_local"])
def test_the_checker_catches_locks_granted_while_held(tmp_path: Path, canary: str) -> None:
    problems = run(tmp_path, canary)
    assert any(p.startswith("overlap") for p in problems), problems[:5]
