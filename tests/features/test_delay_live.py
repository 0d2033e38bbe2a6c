"""Delayed messages on real processes (the issue's item 2): every one of the 18 levels (shortened
by ``--delay-levels``) and arbitrary times are invisible before their time and stored once
after it; a leader kill between the sends and the deliveries loses none and doubles none; the
checker (``chaos.live.checkers.delay``) catches the canaries that deliver early or deliver again
after a leader change."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from chaos.live.checkers.delay import Delivered, check_delayed
from client import BadDelayError, Message, Producer, PullConsumer
from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from protocol import broker_kinds as bp
from protocol.errors import DLedgerError
from tests.broker.test_broker_processes import BROKER, _start_namesrv, _wait_leader
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow

LEVELS_MS = [300 + 40 * k for k in range(18)]  # 300 ms .. 980 ms: the 18 levels, shortened
TOPIC = "delayed"


def cluster_of(tmp_path: Path, ns: str, *extra: str) -> LocalCluster:
    levels = " ".join(f"{ms}ms" for ms in LEVELS_MS)
    return LocalCluster(str(tmp_path), size=3, tick_ms=50, group="a",
                        program=(*BROKER, "--namesrv", ns, "--register-interval-s", "1",
                                 "--delay-levels", levels, *extra))


async def read_all(ns: str, topic: str) -> list[Delivered]:
    """Every message in every queue of ``topic``, from offset 0."""
    out: list[Delivered] = []
    async with PullConsumer(ns, "delay-check", timeout_s=5.0) as consumer:
        for mq in await consumer.fetch_queues(topic):
            offset = 0
            while True:
                res = await consumer.pull(mq, offset, 256)
                for r in res.messages:
                    props = dict(r.properties)
                    out.append(Delivered(r.msg_id, f"{mq.group}/{mq.queue_id}", r.queue_offset,
                                         r.store_ts_ms, int(props.get("TIMER_DELIVER_MS", -1))))
                if not res.messages:
                    break
                offset = res.next_offset
    return out


async def pending(client: LogClient, cluster: LocalCluster) -> int:
    """Timers still pending, as the leader's state has them; -1 while the leader has not caught
    up (a new leader applies its predecessor's entries, timers included, only once its own
    term's first entry commits: until then its count says nothing)."""
    leader = await _wait_leader(client, cluster)
    st = await client.call(leader, bp.BROKER_STATUS)
    return int(st["timers"]["pending"]) if st["caught_up"] else -1


def test_every_level_and_arbitrary_times_are_invisible_until_due_then_stored_once(
        tmp_path: Path) -> None:
    ns_proc, ns = _start_namesrv(tmp_path)

    async def run(cluster: LocalCluster) -> None:
        async with Producer(ns) as producer, LogClient(cluster.client_addresses) as client:
            await producer.send(Message(TOPIC, b"creates the topic"))
            now_ms = int(time.time() * 1000)
            messages = [Message(TOPIC, f"level {k}".encode(), delay_level=k) for k in range(1, 19)]
            messages += [Message(TOPIC, b"delay_ms", delay_ms=700),
                         Message(TOPIC, b"deliver_at", deliver_at_ms=now_ms + 900),
                         Message(TOPIC, b"in the past", deliver_at_ms=now_ms - 60_000)]
            results = await asyncio.gather(*(producer.send(m) for m in messages))
            assert all(r.queue_offset == -1 for r in results)  # known once delivered
            acked = {r.msg_id: -1 for r in results}
            early = await read_all(ns, TOPIC)
            looked_ms = int(time.time() * 1000)
            # at the first look, nothing whose due time had not come was visible
            for d in early:
                assert d.due_ms < 0 or d.due_ms <= looked_ms
            with pytest.raises(BadDelayError):  # RocketMQ's rule: a batch is never delayed
                await producer.send_batch([Message(TOPIC, b"b", delay_level=1)])
            with pytest.raises(BadDelayError):  # beyond the broker's maximum (7 days)
                await producer.send(Message(TOPIC, b"x", delay_ms=8 * 24 * 3600 * 1000))

            async def all_there() -> bool:
                return await pending(client, cluster) == 0
            await wait_until(all_there, 30, "every delayed message delivered")
            delivered = [d for d in await read_all(ns, TOPIC) if d.msg_id in acked]
            assert check_delayed(acked, delivered, nothing_pending=True) == []
            assert len(delivered) == len(messages)
            by_id = {d.msg_id: d for d in delivered}
            for k, r in enumerate(results[:18]):  # each level's due time is its store + level
                assert by_id[r.msg_id].due_ms >= now_ms + LEVELS_MS[k]

    with cluster_of(tmp_path, ns) as cluster:
        try:
            asyncio.run(run(cluster))
        finally:
            ns_proc.terminate()
            ns_proc.wait(timeout=10)


async def kill_between(cluster: LocalCluster, ns: str,
                       overdue: bool = False) -> tuple[dict[str, int], list[Delivered]]:
    """Delayed sends, some delivered before the leader is killed and some after; returns the
    acknowledged ids and what the queues hold once nothing is pending. ``overdue``: instead,
    sends due 300 ms ahead and the leader killed at once, so that the next leader is elected
    after they are due (and finds them overdue before its term's first entry is applied)."""
    async with Producer(ns, send_timeout_s=10.0) as producer, \
            LogClient(cluster.client_addresses) as client:
        await producer.send(Message(TOPIC, b"creates the topic"))
        leader = await _wait_leader(client, cluster)
        first = await asyncio.gather(*(producer.send(Message(
            TOPIC, f"a{k}".encode(), delay_ms=300 if overdue else 200)) for k in range(100)))
        second = [] if overdue else await asyncio.gather(*(producer.send(
            Message(TOPIC, f"b{k}".encode(), delay_ms=3000)) for k in range(100)))
        acked = {r.msg_id: -1 for r in [*first, *second]}
        first_ids = {r.msg_id for r in first}

        async def first_delivered() -> bool:
            return first_ids <= {d.msg_id for d in await read_all(ns, TOPIC)}
        if not overdue:
            await wait_until(first_delivered, 30, "the first delayed messages delivered")
            leader = await _wait_leader(client, cluster)
        cluster.kill(leader)

        async def none_pending() -> bool:
            try:
                return await pending(client, cluster) == 0
            except DLedgerError:
                return False
        await wait_until(none_pending, 60, "the new leader to deliver what was pending")
        # Any replica serves a pull, and one a heartbeat behind the leader reads short (a CI run
        # read one queue short, it seems so, with nothing pending at the leader): read until
        # every acknowledged message is there, or the time is up (the checker names the lost).
        read: list[Delivered] = []

        async def all_read() -> bool:
            read[:] = [d for d in await read_all(ns, TOPIC) if d.msg_id in acked]
            return set(acked) <= {d.msg_id for d in read}
        with contextlib.suppress(AssertionError):
            await wait_until(all_read, 20, "every acknowledged message readable")
        return acked, read


@pytest.mark.parametrize("overdue", [False, True])
def test_a_leader_kill_between_sends_and_deliveries_loses_none_and_doubles_none(
        tmp_path: Path, overdue: bool) -> None:
    """``overdue``: the live chaos features (S6) once froze a new leader that found a timer
    overdue before its term's first entry was applied (its delay loop spun without awaiting:
    ``test_delay.test_only_a_leader_that_may_deliver_looks_again_at_once``). That needed the
    loop to look within a window of a few ms, so this does not reproduce it every time."""
    ns_proc, ns = _start_namesrv(tmp_path)
    try:
        with cluster_of(tmp_path, ns) as cluster:
            acked, delivered = asyncio.run(kill_between(cluster, ns, overdue))
        assert check_delayed(acked, delivered, nothing_pending=True) == []
        assert len(delivered) == (100 if overdue else 200)
    finally:
        ns_proc.terminate()
        ns_proc.wait(timeout=10)


@pytest.mark.parametrize("canary, violation", [("timer_redeliver", "twice: "),
                                               ("delay_early", "early: ")])
def test_the_checker_catches_the_delay_canaries(tmp_path: Path, canary: str,
                                                violation: str) -> None:
    ns_proc, ns = _start_namesrv(tmp_path)
    try:
        with cluster_of(tmp_path, ns, "--test-faults", "--broker-canary", canary) as cluster:
            acked, delivered = asyncio.run(kill_between(cluster, ns))
        problems = check_delayed(acked, delivered, nothing_pending=True)
        assert any(p.startswith(violation) for p in problems), problems
    finally:
        ns_proc.terminate()
        ns_proc.wait(timeout=10)

