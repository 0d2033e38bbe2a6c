"""Consumer groups on one NameServer and two broker groups (module-scoped; a fresh topic and
consumer group per case), issue 34. Item 6: a push consumer follows its topics' routes and its
group's members at once: started right after ``dledger topic create``, it owns every queue of
both groups within 3 s, in 10 of 10 trials; a group that starts serving the topic after the
consumer started is taken within 3 s (the window the first case hits by chance, made wide); a
member that joins or leaves is heard of from the brokers' notice, not at the next heartbeat.
Item 7: two broadcasting consumers of one group in one process with default options both start
and both read every message; a start that fails leaves nothing running and can be retried.
Item 8: members that subscribe differently are flagged in their logs, ``dledger consumer
status`` and the console."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner

import cli
from client import Message, Producer, PushConsumer, UnavailableError
from client.cluster.routes import Routes
from client.types import ConsumeStatus, ReceivedMessage
from tests.clusters import namesrv_groups
from tests.nodes.test_processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TRIALS = 10
OWN_ALL_S = 3.0  # the bar: all 8 queues within 3 s of start()


@pytest.fixture(scope="module")
def ns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Both groups registered with a leader (the fixture returns once one serves sends), and a
    topic created on both routed by both."""
    base: Path = tmp_path_factory.mktemp("two-groups")
    with namesrv_groups(base) as (address, _):
        asyncio.run(_both_registered(address))
        _create(address, "both-groups-routed")
        asyncio.run(_both_registered(address, "both-groups-routed"))
        yield address


async def _both_registered(ns: str, topic: str | None = None) -> None:
    routes = Routes(ns)
    await routes.start()
    try:
        async def both() -> bool:
            if topic is None:
                return {g.group for g in await routes.cluster_groups() if g.leader} == {"a", "b"}
            route = await routes.route(topic, refresh=True)
            return route.exists and {g.group for g in route.groups} == {"a", "b"}
        await wait_until(both, 60, f"both groups registered (routing {topic})")
    finally:
        await routes.close()


def _create(ns: str, topic: str, *groups: str) -> None:
    args = ["topic", "create", "--namesrv", ns, "--queues", "4", topic]
    for g in groups:
        args[2:2] = ["--group", g]
    res = CliRunner().invoke(cli.main, args)
    assert res.exit_code == 0, res.output


def _ignore(batch: list[ReceivedMessage]) -> ConsumeStatus:
    return ConsumeStatus.SUCCESS


async def _owns_all(ns: str, topic: str, group: str) -> None:
    """A push consumer with default options owns the 8 queues within OWN_ALL_S of start()."""
    consumer = PushConsumer(ns, group, _ignore)
    consumer.subscribe(topic)
    began = time.monotonic()
    await consumer.start()
    try:
        await wait_until(lambda: len([q for q in consumer.assigned if q.topic == topic]) == 8,
                         max(0.1, began + OWN_ALL_S - time.monotonic()),
                         f"the consumer of {topic} to own its 8 queues "
                         f"(owns {sorted(consumer.assigned)})")
    finally:
        await consumer.close()


def test_a_consumer_started_right_after_topic_create_owns_all_eight_queues(ns: str) -> None:
    for trial in range(TRIALS):
        topic = f"fresh-{trial}"
        _create(ns, topic)
        asyncio.run(_owns_all(ns, topic, f"fresh-group-{trial}"))


def test_a_group_that_starts_serving_the_topic_later_is_taken_at_once(ns: str) -> None:
    """The route the consumer reads at start has group a only; group b gets the topic a moment
    later (what a consumer started between the two groups' registrations sees)."""
    async def run() -> None:
        consumer = PushConsumer(ns, "late-group-readers", _ignore)
        consumer.subscribe("late-group")
        await consumer.start()
        try:
            assert {q.group for q in consumer.assigned} == {"a"}
            await asyncio.to_thread(_create, ns, "late-group", "b")
            began = time.monotonic()
            await wait_until(lambda: len(consumer.assigned) == 8,
                             max(0.1, began + OWN_ALL_S - time.monotonic()),
                             f"group b's queues (owns {sorted(consumer.assigned)})")
        finally:
            await consumer.close()

    _create(ns, "late-group", "a")
    asyncio.run(run())


def test_members_hear_of_a_member_joining_and_leaving_from_the_brokers_notice(ns: str) -> None:
    """Heartbeats 30 s apart: the first member learns of the second, and of its leaving, from
    the brokers' CONSUMER_IDS_CHANGED notice (RocketMQ's NOTIFY_CONSUMER_IDS_CHANGED), and
    rebalances at once, long before its next heartbeat."""
    def member() -> PushConsumer:
        c = PushConsumer(ns, "noticed-readers", _ignore, heartbeat_s=30)
        c.subscribe("noticed")
        return c

    async def run() -> None:
        async with member() as first:
            await wait_until(lambda: len(first.assigned) == 8, OWN_ALL_S, "the topic's 8 queues")
            async with member() as second:
                await wait_until(lambda: len(first.members) == 2 and len(first.assigned) == 4,
                                 10, f"the first member to hear of the second "
                                     f"(members {first.members}, owns {len(first.assigned)})")
                assert not set(first.assigned) & set(second.assigned)
            await wait_until(lambda: first.members == [first.client_id]
                             and len(first.assigned) == 8, 10,
                             f"the first member to hear that the second left "
                             f"(members {first.members}, owns {len(first.assigned)})")

    _create(ns, "noticed")
    asyncio.run(run())


class Bodies:
    def __init__(self) -> None:
        self.seen: Counter[bytes] = Counter()

    def __call__(self, batch: list[ReceivedMessage]) -> ConsumeStatus:
        self.seen.update(m.body for m in batch)
        return ConsumeStatus.SUCCESS


def test_two_broadcasting_consumers_of_one_group_in_one_process_both_read_everything(
        ns: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Default options: both would be ``<host>@DEFAULT`` with one progress file; the second
    takes ``<host>@DEFAULT#2`` (its own file, under ~/.dledger/offsets, here in a temp dir)."""
    monkeypatch.setenv("HOME", str(tmp_path))

    async def run() -> None:
        readers = [Bodies(), Bodies()]
        consumers = [PushConsumer(ns, "bcast-readers", r, model="broadcasting") for r in readers]
        for c in consumers:
            c.subscribe("bcast")
        async with consumers[0], consumers[1], Producer(ns) as producer:
            assert consumers[0].client_id != consumers[1].client_id
            assert consumers[1].client_id == consumers[0].client_id + "#2"
            queues = await producer.queues("bcast")
            warm = 0

            async def warmed() -> bool:  # each reads every queue now (it started at the last)
                nonlocal warm
                warm += 1
                for q in queues:
                    await producer.send_to(Message("bcast", b"warm-%d" % warm), q)
                return all(sum(v for k, v in r.seen.items() if k.startswith(b"warm")) >= 8 * 2
                           for r in readers)
            await wait_until(warmed, 30, "both consumers reading every queue")
            bodies = [b"m-%d" % i for i in range(40)]
            for body in bodies:
                await producer.send(Message("bcast", body))
            await wait_until(lambda: all(r.seen[b] >= 1 for r in readers for b in bodies), 20,
                             "both consumers to read every message")
        files = list((tmp_path / ".dledger" / "offsets").glob("*/bcast-readers.json"))
        assert len(files) == 2, files  # each wrote its own progress at close

    _create(ns, "bcast")
    asyncio.run(run())


def test_a_failed_start_leaves_nothing_running_and_can_be_retried(ns: str) -> None:
    """The start fails after its first rebalance took queues (their pullers running): they stop
    and its connections close (aiohttp reports a session collected unclosed to the loop's
    exception handler); the next start() works."""
    async def run() -> None:
        reported: list[str] = []
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, context: reported.append(str(context.get("message"))))
        c = PushConsumer(ns, "failing-start", _ignore)
        c.subscribe("failing")
        rebalance = c._rebalance
        taken: list[int] = []

        async def rebalance_then_fail() -> None:
            await rebalance()
            taken.append(len(c.assigned))
            raise UnavailableError("a failure forced after the queues were taken")
        c._rebalance = rebalance_then_fail  # type: ignore[method-assign]
        before = asyncio.all_tasks()
        with pytest.raises(UnavailableError, match="forced"):
            await c.start()
        assert taken and taken[0] > 0  # (4 or 8: the route may name one group at first)
        left = asyncio.all_tasks() - before
        assert not left, f"a failed start left {len(left)} task(s): {sorted(map(str, left))[:2]}"
        assert c.assigned == []
        gc.collect()
        assert not reported, reported
        c._rebalance = rebalance  # type: ignore[method-assign]
        await c.start()
        try:
            await wait_until(lambda: len(c.assigned) == 8, 10, "the retried start's queues")
        finally:
            await c.close()

    _create(ns, "failing")
    asyncio.run(run())


def test_members_that_subscribe_differently_are_flagged_in_the_log_status_and_console(
        ns: str, caplog: pytest.LogCaptureFixture) -> None:
    """Item 8: one member reads every tag of the topic, the other TagA only: each warns in its
    log once (not at each heartbeat or comparison since), ``dledger consumer status`` and the
    console flag the group; once the odd member leaves, the other says so."""
    caplog.set_level(logging.INFO, logger="client.consumer.watch")

    def warnings_of(group: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and group in r.getMessage() and "subscribe differently" in r.getMessage()]

    async def run() -> None:
        every = PushConsumer(ns, "mixed-readers", _ignore, heartbeat_s=0.5)
        every.subscribe("mixed")
        tag_a = PushConsumer(ns, "mixed-readers", _ignore, heartbeat_s=0.5)
        tag_a.subscribe("mixed", "TagA")
        async with every:
            async with tag_a:
                await wait_until(lambda: len(warnings_of("mixed-readers")) >= 2, 10,
                                 "a warning from each member")
                for _ in range(3):  # compared again, nothing changed: no new warning
                    await every._watch.check_subscriptions()
                    await tag_a._watch.heartbeat(check=True)
                assert len(warnings_of("mixed-readers")) == 2, warnings_of("mixed-readers")
                assert "mixed TagA" in warnings_of("mixed-readers")[0]
                status = await asyncio.to_thread(CliRunner().invoke, cli.main, [
                    "consumer", "status", "mixed-readers", "--namesrv", ns])
                assert status.exit_code == 0, status.output
                assert "WARNING: the members subscribe differently" in status.output
                assert f"{tag_a.client_id}: mixed TagA" in status.output
                async with aiohttp.ClientSession() as http, http.get(
                        f"http://{ns}/console/api/consumer-groups/mixed-readers") as resp:
                    console = await resp.json()
                assert set(console["subscription_conflict"].split(" | ")) == {
                    f"{every.client_id}: mixed *", f"{tag_a.client_id}: mixed TagA"}
            await wait_until(lambda: any("subscribe alike again" in r.getMessage()
                                         for r in caplog.records), 10, "the all-clear")
        assert len(warnings_of("mixed-readers")) == 2

    _create(ns, "mixed")
    asyncio.run(run())
