"""Transactional messages on real processes (issue 18 items 2 and 3): the seed's three tags
(COMMIT, ROLLBACK, UNKNOWN resolved by check-back); a leader killed between the half message and
the COMMIT, and between the COMMIT and its answer (each committed message consumed exactly once,
each rolled-back one never); a producer process killed after its half messages, whose successor
in the same producer group gets the check-backs and resolves them."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli import main as cli_main
from client import (
    BadTransactionError,
    Message,
    PullConsumer,
    ReceivedMessage,
    TopicNotFoundError,
    TransactionProducer,
    TransactionState,
)
from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from protocol import broker_kinds as bp
from tests.broker.test_broker_processes import _wait_leader
from tests.clusters import namesrv_group
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow
FAST_CHECKS = ("--transaction-timeout-s", "1", "--transaction-check-interval-s", "0.5")
ROOT = Path(__file__).resolve().parents[2]


class SeedListener:
    """The seed's ICBCTransactionListener: TAGA commits, TAGB rolls back, TAGC is not known
    (checked back, then committed)."""

    def __init__(self) -> None:
        self.checked: list[str] = []
        self.checked_ids: set[str] = set()

    def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
        return {"TAGA": TransactionState.COMMIT,
                "TAGB": TransactionState.ROLLBACK}.get(message.tags, TransactionState.UNKNOWN)

    def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        self.checked.append(message.tags)
        self.checked_ids.add(message.msg_id)
        return TransactionState.COMMIT


async def consumed(ns: str, topic: str) -> list[ReceivedMessage]:
    """Every message of every queue of ``topic``, from the start (none if no group serves it)."""
    out: list[ReceivedMessage] = []
    async with PullConsumer(ns, "reader") as c:
        try:
            queues = await c.fetch_queues(topic, wait=False)
        except TopicNotFoundError:
            return []
        for mq in queues:
            offset = 0
            while True:
                r = await c.pull(mq, offset, 256)
                out += r.messages
                if not r.messages:
                    break
                offset = r.next_offset
    return out


def test_the_seeds_three_tags(tmp_path: Path) -> None:
    async def scenario(ns: str) -> None:
        listener = SeedListener()
        async with TransactionProducer(ns, "tpg", listener, trace=True) as p:
            results = [await p.send(Message("TTopic", f"Hi,{i}".encode(), tags=tag))
                       for i, tag in enumerate(["TAGA", "TAGB", "TAGC"])]
            assert [r.state for r in results] == [TransactionState.COMMIT,
                                                  TransactionState.ROLLBACK,
                                                  TransactionState.UNKNOWN]
            assert results[0].committed is not None and results[1].committed is None
            assert all(r.half.queue.topic == "TTopic" for r in results)
            assert await p.producers() == {p.client_id}

            async def listed_by_every_node() -> bool:  # (a node that missed one heartbeat
                listed = await asyncio.to_thread(  # has the next one)
                    CliRunner().invoke, cli_main, ["producer", "list", "--namesrv", ns, "tpg"])
                assert listed.exit_code == 0, listed.output
                return sum(p.client_id in ln for ln in listed.output.splitlines()) == 3
            await wait_until(listed_by_every_node, 30, "the producer listed by the 3 nodes")
            with pytest.raises(BadTransactionError):
                await p.send(Message("TTopic", b"later", delay_level=2))

            async def resolved() -> bool:
                return len(await consumed(ns, "TTopic")) == 2
            await wait_until(resolved, 30, "TAGC committed by check-back")
            got = sorted((m.tags, m.body) for m in await consumed(ns, "TTopic"))
            assert got == [("TAGA", b"Hi,0"), ("TAGC", b"Hi,2")]
            assert listener.checked[:1] == ["TAGC"]  # TAGC only: TAGA and TAGB had ended
            assert set(listener.checked) == {"TAGC"}
            assert listener.checked_ids == {results[2].transaction_id}  # the id as sent
            first = next(m for m in await consumed(ns, "TTopic") if m.tags == "TAGA")
            assert first.offset_msg_id == results[0].committed.offset_msg_id
            assert first.msg_id == results[0].transaction_id
            assert dict(first.properties).get("TRAN_MSG") == "true"
        traced = results[0].committed.offset_msg_id  # (written by the producer's close)

        async def send_traced() -> bool:
            out = await asyncio.to_thread(CliRunner().invoke, cli_main,
                                          ["message", "trace", "--namesrv", ns, traced])
            return out.exit_code == 0 and "TXN_COMMIT" in out.output and "tpg" in out.output
        await wait_until(send_traced, 30, "the transactional send's trace record")

    with namesrv_group(tmp_path, *FAST_CHECKS) as (ns, _):
        asyncio.run(scenario(ns))


class KillingListener:
    """Commits every transaction; for the ones named, kills the group's leader first (between
    the half message and the COMMIT) or just after returning (the COMMIT in flight)."""

    def __init__(self, cluster: LocalCluster, leader: list[str]) -> None:
        self.cluster, self.leader = cluster, leader
        self.kill_before: set[bytes] = set()
        self.kill_during: set[bytes] = set()
        self.timers: list[threading.Timer] = []  # the kills "during" still to come

    def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
        if message.body in self.kill_before:
            self.cluster.kill(self.leader[0])
        elif message.body in self.kill_during:  # 5 ms later: while the END is on its way
            timer = threading.Timer(0.005, self.cluster.kill, (self.leader[0],))
            self.timers.append(timer)
            timer.start()
        return TransactionState.ROLLBACK if message.body.startswith(b"rb") \
            else TransactionState.COMMIT

    def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        return TransactionState.ROLLBACK if message.body.startswith(b"rb") \
            else TransactionState.COMMIT


def test_a_leader_killed_around_the_commit_publishes_each_committed_message_once(
        tmp_path: Path) -> None:
    async def scenario(ns: str, cluster: LocalCluster) -> None:
        client = LogClient(cluster.client_addresses)
        leader = [await _wait_leader(client, cluster)]
        listener = KillingListener(cluster, leader)
        sent: list[bytes] = []
        results: list[Any] = []
        async with TransactionProducer(ns, "kpg", listener, send_timeout_s=15.0) as p:
            for round_, mode in enumerate(["before", "during", "before", "during"]):
                body = f"c{round_}-kill".encode()
                (listener.kill_before if mode == "before" else listener.kill_during).add(body)
                for b in [f"c{round_}-x".encode(), body, f"rb{round_}".encode(),
                          f"c{round_}-y".encode()]:
                    results.append(await p.send(Message("KTopic", b)))
                    sent.append(b)
                killed = leader[0]
                for timer in listener.timers:  # the kill was due 5 ms after the END: it has
                    timer.join(10)  # happened (a loaded box may run the timer late)
                assert not cluster.servers[killed].running, f"{killed} was not killed"
                leader[0] = await _wait_leader(client, cluster)
                cluster.restart(killed)  # (the group keeps a majority for the next round)
            committed = [b for b in sent if not b.startswith(b"rb")]

            seen: list[bytes] = []

            async def all_visible() -> bool:
                seen[:] = [m.body for m in await consumed(ns, "KTopic")]
                return len(seen) >= len(committed)
            try:
                await wait_until(all_visible, 60, "every committed message visible")
            except AssertionError as err:
                raise AssertionError(f"{err}; missing {set(committed) - set(seen)}, "
                                     f"results {results}") from None
            counts = Counter(m.body for m in await consumed(ns, "KTopic"))
            assert counts == Counter(committed), counts  # once each, no rolled-back one
        # the COMMIT's answer lost: the same END again, to the new leader, publishes nothing
        async with TransactionProducer(ns, "kpg", listener) as p:
            r = await p.send(Message("KTopic", b"c9-once"))
            assert r.committed is not None
            cluster.kill(leader[0])
            leader[0] = await _wait_leader(client, cluster)
            again = await client.call_leader(bp.END_TRANSACTION, "kpg", r.transaction_id,
                                             "COMMIT", False, [], timeout_s=10)
            assert again[1] == ["COMMIT", []]  # answered as the first, nothing stored again
            with pytest.raises(Exception, match="TXN_ALREADY_DECIDED"):
                await client.call_leader(bp.END_TRANSACTION, "kpg", r.transaction_id,
                                         "ROLLBACK", False, [], timeout_s=10)
        # A read may go to a replica that has not applied the commit yet (a restarted node
        # catching up serves what it has): wait until the copy is seen, then count it.
        counts: Counter[bytes] = Counter()

        async def once_visible() -> bool:
            counts.clear()
            counts.update(m.body for m in await consumed(ns, "KTopic"))
            return counts[b"c9-once"] >= 1
        await wait_until(once_visible, 60, "the committed c9-once visible")
        assert counts[b"c9-once"] == 1
        await client.close()

    with namesrv_group(tmp_path, *FAST_CHECKS) as (ns, cluster):
        asyncio.run(scenario(ns, cluster))


PRODUCER_SCRIPT = """
import asyncio, sys
from client import Message, TransactionProducer, TransactionState

class Unknown:
    def execute_local_transaction(self, message, arg):
        return TransactionState.UNKNOWN
    def check_local_transaction(self, message):
        return TransactionState.UNKNOWN  # this process never learns: it is killed

async def main(ns):
    async with TransactionProducer(ns, "rpg", Unknown()) as p:
        for k in range(10):
            await p.send(Message("RTopic", f"m{k}".encode()))
        print("sent", flush=True)
        await asyncio.sleep(3600)  # until killed

asyncio.run(main(sys.argv[1]))
"""


class ByParity:
    """The successor's record of its predecessor's local transactions: even ones happened."""

    def __init__(self) -> None:
        self.checked: Counter[bytes] = Counter()

    def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
        return TransactionState.COMMIT

    def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        self.checked[message.body] += 1
        return TransactionState.COMMIT if int(message.body[1:]) % 2 == 0 \
            else TransactionState.ROLLBACK


def test_a_restarted_producer_resolves_what_its_predecessor_began(tmp_path: Path) -> None:
    async def scenario(ns: str) -> None:
        proc = subprocess.Popen([sys.executable, "-c", PRODUCER_SCRIPT, ns], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
            assert line.strip() == "sent"
        finally:
            os.kill(proc.pid, signal.SIGKILL)  # mid-transaction: ten open, none ended
            proc.wait(timeout=10)
        assert await consumed(ns, "RTopic") == []
        listener = ByParity()
        async with TransactionProducer(ns, "rpg", listener):
            async def resolved() -> bool:
                return len(await consumed(ns, "RTopic")) == 5 and len(listener.checked) == 10
            await wait_until(resolved, 60, "the successor resolving the ten transactions")
        got = sorted(m.body for m in await consumed(ns, "RTopic"))
        assert got == [f"m{k}".encode() for k in (0, 2, 4, 6, 8)]

    with namesrv_group(tmp_path, *FAST_CHECKS) as (ns, _):
        asyncio.run(scenario(ns))


def test_an_unresolved_transaction_rolls_back_after_the_last_check(tmp_path: Path) -> None:
    class Silent(SeedListener):
        def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
            self.checked.append(message.tags)
            return TransactionState.UNKNOWN

    async def scenario(ns: str) -> None:
        listener = Silent()
        async with TransactionProducer(ns, "spg", listener) as p:
            r = await p.send(Message("STopic", b"never", tags="TAGC"))

            async def in_check_max() -> bool:
                got = await consumed(ns, "TRANS_CHECK_MAX_TIME_TOPIC")
                return any(m.msg_id == r.transaction_id for m in got)
            await wait_until(in_check_max, 30, "the half message in the check-max topic")
        assert listener.checked == ["TAGC"] * 2  # --transaction-check-max 2
        assert await consumed(ns, "STopic") == []

    with namesrv_group(tmp_path, *FAST_CHECKS, "--transaction-check-max", "2") as (ns, _):
        asyncio.run(scenario(ns))


def test_open_transactions_survive_a_restart_of_every_node(tmp_path: Path) -> None:
    """Open transactions in the checkpoint and the log's tail: every node killed and started
    again before any check-back; the new leader checks them back and they end as answered."""
    async def scenario(ns: str, cluster: LocalCluster) -> None:
        listener = ByParity()

        class Unknown(ByParity):
            def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
                return TransactionState.UNKNOWN

        async with TransactionProducer(ns, "opg", Unknown()) as p:
            for k in range(6):
                await p.send(Message("OTopic", f"m{k}".encode()))
        for nid in sorted(cluster.servers):
            cluster.kill(nid)
        for nid in sorted(cluster.servers):
            cluster.restart(nid)
        async with TransactionProducer(ns, "opg", listener):
            async def resolved() -> bool:
                return len(await consumed(ns, "OTopic")) == 3 and len(listener.checked) == 6
            await wait_until(resolved, 60, "the six transactions resolved after the restart")
        assert sorted(m.body for m in await consumed(ns, "OTopic")) == [b"m0", b"m2", b"m4"]

    with namesrv_group(tmp_path, "--transaction-timeout-s", "4", "--transaction-check-interval-s",
                       "0.5", "--checkpoint-interval-s", "0.5") as (ns, cluster):
        asyncio.run(scenario(ns, cluster))
