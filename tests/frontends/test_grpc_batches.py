"""Batches through SendMessage (issue 35, items 3 and 6): several messages of one topic in one call
are stored all or nothing (one SEND, one log entry), contiguous and in order in one queue, each
answered with its own receipt; what a batch may not hold is refused by name. Across a leader
killed (SIGKILL) while batches of ten are sent in a loop, the batch checker
(``chaos.live.checkers.batch``) finds every batch wholly stored or wholly absent, and every
acknowledged one stored; its canary ``grpc_batch_torn`` (a batch's first half stored alone) is
caught by the same check.

The official Python client 5.1.2 sends one message per call, so these tests call the protocol's
generated stubs directly (``tests.frontends.raw``)."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb

from chaos.live.checkers.batch import BatchVerdict, Stored, check_batches
from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from tests.broker.test_broker_processes import _wait_leader
from tests.clusters import namesrv_group
from tests.frontends.endpoints import grpc_endpoints
from tests.frontends.grpc_helpers import read_all
from tests.frontends.raw import message, send, stub
from tests.frontends.test_grpc_failover import wait_for

pytestmark = pytest.mark.slow

BATCH = 10


def batch(topic: str, k: int, n: int = BATCH, **fields: Any) -> list[Any]:
    return [message(topic, b"b%05d-%d" % (k, i), f"B{k:05d}-{i}", **fields) for i in range(n)]


def _where(m: Any) -> tuple[str, int]:
    return f"{m.queue.group}/{m.queue.topic}/{m.queue.queue_id}", m.queue_offset


def test_a_batch_is_one_send_answered_per_message_and_what_it_may_not_hold_is_refused(
        cluster: tuple[str, str]) -> None:
    ns, endpoints = cluster
    with stub(endpoints.split(";")[0]) as s:
        sent = send(s, *batch("batched", 1))
        assert sent.status.code == pb.Code.OK, sent.status
        assert [e.message_id for e in sent.entries] == [f"B00001-{i}" for i in range(BATCH)]
        assert all(e.status.code == pb.Code.OK for e in sent.entries)
        offsets = [e.offset for e in sent.entries]
        assert offsets == list(range(offsets[0], offsets[0] + BATCH))
        fifo = send(s, *batch("batched", 2, n=4, group="order-1"))
        assert fifo.status.code == pb.Code.OK, fifo.status
        again = send(s, *batch("batched", 1))  # a retried batch: its receipts, nothing stored
        assert [e.offset for e in again.entries] == offsets

        def refused(messages: list[Any], code: int, text: str) -> None:
            got = send(s, *messages)
            assert got.status.code == code and text in got.status.message, got.status
            assert len(got.entries) == len(messages)
            assert all(e.status.code == code for e in got.entries)

        late = message("batched", b"d", "D1", kind=pb.MessageType.DELAY)
        late.system_properties.delivery_timestamp.FromMilliseconds(int(time.time() * 1000) + 60_000)
        half = message("batched", b"t", "T1", kind=pb.MessageType.TRANSACTION)
        mixed_fifo = [*batch("batched", 3, n=2, group="g1"), *batch("batched", 4, n=2)]
        refused([*batch("batched", 5, n=2), message("other", b"x", "X1")], pb.Code.BAD_REQUEST,
                "share one topic")
        refused([*batch("batched", 6, n=2), late], pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                "cannot hold DELAY")
        refused([*batch("batched", 7, n=2), half], pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                "cannot hold TRANSACTION")
        refused(mixed_fifo, pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "all NORMAL or all FIFO")
        refused([*batch("batched", 8, n=2, group="g1"), *batch("batched", 9, n=2, group="g2")],
                pb.Code.ILLEGAL_MESSAGE_GROUP, "share one message group")
        refused([*batch("batched", 10, n=2), *batch("batched", 10, n=1)],
                pb.Code.ILLEGAL_MESSAGE_ID, "twice in the batch")
        refused(batch("batched", 11, n=1025), pb.Code.BAD_REQUEST, "1..1024 messages")
        big = [message("batched", b"x" * (3 << 20), f"L{i}") for i in range(2)]
        refused(big, pb.Code.PAYLOAD_TOO_LARGE, "exceeds")
    stored = asyncio.run(read_all(ns, "batched", BATCH + 4))
    assert len(stored) == BATCH + 4  # nothing of the refused batches, nothing twice
    by_id = {m.msg_id: _where(m) for m in stored}
    for k, n in ((1, BATCH), (2, 4)):  # each batch in one queue, contiguous, in order
        places = [by_id[f"B{k:05d}-{i}"] for i in range(n)]
        assert len({q for q, _ in places}) == 1
        assert [o for _, o in places] == list(range(places[0][1], places[0][1] + n))
    assert places[0][1] == fifo.entries[0].offset


class Sender:
    """Batches of ten sent in a loop from a thread, each retried (the same message ids, so the
    broker deduplicates) on the next endpoint until acknowledged or its own deadline passes."""

    def __init__(self, endpoints: list[str], batch_deadline_s: float) -> None:
        self.endpoints = endpoints
        self.batch_deadline_s = batch_deadline_s
        self.batches: dict[str, list[str]] = {}
        self.acked: set[str] = set()
        self.failures = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        k, at = 0, 0
        while not self.stop.is_set():
            messages = batch("atomic", k)
            batch_id = f"B{k:05d}"
            self.batches[batch_id] = [m.system_properties.message_id for m in messages]
            deadline = time.monotonic() + self.batch_deadline_s
            while time.monotonic() < deadline and not self.stop.is_set():
                try:
                    with stub(self.endpoints[at % len(self.endpoints)]) as s:
                        if send(s, *messages, timeout_s=5).status.code == pb.Code.OK:
                            self.acked.add(batch_id)
                            break
                except Exception:  # the node is down: an unknown outcome, try the next
                    pass
                self.failures += 1
                at += 1
                self.stop.wait(0.05)  # (a client's back-off between tries, not a wait)
            k += 1

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(30)


def run_batches(ns: str, cluster: LocalCluster, kill_leader: bool,
                batch_deadline_s: float) -> BatchVerdict:
    wait_for(lambda: grpc_endpoints(ns).count(";") == 2, 30, "the gRPC endpoints")
    sender = Sender(grpc_endpoints(ns).split(";"), batch_deadline_s)
    sender.thread.start()
    if kill_leader:
        wait_for(lambda: len(sender.acked) >= 20, 60, "the first batches")

        async def leader() -> str:
            async with LogClient(cluster.client_addresses, timeout_s=5) as client:
                return await _wait_leader(client, cluster)
        cluster.kill(asyncio.run(leader()), signal.SIGKILL)
        at_kill = len(sender.acked)
        wait_for(lambda: len(sender.acked) >= at_kill + 20, 90, "batches after the kill")
    else:
        wait_for(lambda: len(sender.batches) >= 4, 60, "a few batches")
    sender.finish()
    # (every message stored: the last pass of the read has them all; at least one is there)
    stored = asyncio.run(read_all(ns, "atomic", max(1, BATCH * len(sender.acked)), timeout_s=60))
    verdict = check_batches(sender.batches, sender.acked,
                            [Stored(m.msg_id, *_where(m)) for m in stored])
    print(f"batches {verdict.batches}, acknowledged {verdict.acked}, wholly stored "
          f"{verdict.present}, failed tries {sender.failures}")
    return verdict


def test_a_batch_of_ten_is_stored_all_or_nothing_across_a_leader_kill(tmp_path: Path) -> None:
    with namesrv_group(tmp_path, "--grpc-listen", "127.0.0.1:0") as (ns, cluster):
        verdict = run_batches(ns, cluster, kill_leader=True, batch_deadline_s=30)
    assert verdict.ok, verdict.lines()
    assert verdict.present >= verdict.acked >= 40


def test_the_batch_checker_catches_a_batch_stored_half(tmp_path: Path) -> None:
    with namesrv_group(tmp_path, "--grpc-listen", "127.0.0.1:0", "--test-faults",
                       "--broker-canary", "grpc_batch_torn") as (ns, cluster):
        verdict = run_batches(ns, cluster, kill_leader=False, batch_deadline_s=1)
    assert verdict.torn, "the seeded bug went unnoticed"
    assert verdict.acked == 0 and not verdict.lost
