"""A push consumer follows its topics' routes and its group's members at once (issue 34 item 6),
on one NameServer and two broker groups (module-scoped; a fresh topic and consumer group per
case): started right after ``dledger topic create``, it owns every queue of both groups within
3 s, in 10 of 10 trials; a group that starts serving the topic after the consumer started is
taken within 3 s (the window the first case hits by chance, made wide); and a member that joins
is seen by the others through the broker's notice, not at their next heartbeat."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import cli
from client import PushConsumer
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
            assert len(first.assigned) == 8
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
