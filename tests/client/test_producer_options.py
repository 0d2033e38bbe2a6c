"""The producer's own limits (issue 34 item 11) and the blocking producer's oneway send (item 18),
on real processes: a NameServer and a 3-node broker group whose maximum message is 64 KiB and
whose topics created by a send get 4 queues (the defaults but the size).

- ``default_topic_queue_nums`` (RocketMQ's setDefaultTopicQueueNums): a topic the producer's send
  creates gets that many queues; the broker checks the count itself (1..1024, else BAD_REQUEST
  naming it) and creates at most its own ``--default-queues`` (RocketMQ's cap).
- ``max_message_size_bytes`` (setMaxMessageSize): a larger message or batch is refused by name
  before it is sent; the broker still refuses what exceeds its own maximum.
- ``SyncProducer.send_oneway``: hands the message over and returns; it is stored."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from client import ClientClosedError, Message, MessageTooLargeError, Producer, PullConsumer, SyncProducer
from client.cluster.routes import Routes
from client.producer.producer import _encode
from protocol import broker_kinds as bp
from protocol.envelope import BadRequestError
from tests.clusters import namesrv_group, registered_group
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow

BROKER_MAX_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def ns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with namesrv_group(tmp_path_factory.mktemp("options"), "--max-message-bytes",
                       str(BROKER_MAX_BYTES)) as (addr, _):
        yield addr


async def created_queues(routes: Routes, topic: str) -> int:
    """The write queues of ``topic`` once its group has registered it (a second or so)."""
    async def registered() -> bool:
        return (await routes.route(topic, refresh=True)).exists
    await wait_until(registered, 30, f"{topic} in the NameServer's routes")
    (group,) = (await routes.route(topic)).groups
    assert group.read_queues == group.write_queues
    return group.write_queues


def test_a_topic_the_producer_creates_gets_its_queue_count(ns: str) -> None:
    """The notes' AsyncProducer: setDefaultTopicQueueNums(2), then 100 async sends."""
    async def body() -> None:
        async with Producer(ns, default_topic_queue_nums=2) as p:
            results = await asyncio.gather(*(p.send(Message("two-queues", b"%d" % i))
                                             for i in range(100)))
            assert {r.queue.queue_id for r in results} == {0, 1}
            assert await created_queues(p._routes, "two-queues") == 2

    asyncio.run(body())


def test_the_queue_count_option_is_checked_by_the_producer() -> None:
    for bad in (0, 1025, -1, "2", 2.0, True):
        with pytest.raises(ValueError, match="default_topic_queue_nums"):
            Producer("127.0.0.1:1", default_topic_queue_nums=bad)  # type: ignore[arg-type]
    for bad in (0, 8 * 1024 * 1024 + 1, "1"):
        with pytest.raises(ValueError, match="max_message_size_bytes"):
            Producer("127.0.0.1:1", max_message_size_bytes=bad)  # type: ignore[arg-type]


def test_the_broker_checks_the_queue_count_a_send_asks_for_and_caps_it(ns: str) -> None:
    """Requests written by hand, past the producer's own check: a count out of 1..1024 or not an
    integer is refused as BAD_REQUEST naming it, and creates nothing; one above the broker's
    default (4) creates 4 queues."""
    async def body() -> None:
        routes = Routes(ns)
        await routes.start()
        try:
            group = await registered_group(routes)
            raws = _encode([Message("x", b"x")])
            for bad in (0, -1, 1025, "2", 2.5, True, None):
                _, answers = await routes.call_group_leader(
                    group, bp.SEND_RUNS, [["bad-count", 0, raws, bad]])
                assert answers[0][0] == "BAD_REQUEST" and "queue count" in answers[0][1], answers
                with pytest.raises(BadRequestError, match="queue count"):  # BAD_REQUEST
                    await routes.call_group_leader(group, bp.SEND, "bad-count", 0, raws, bad)
            _, answers = await routes.call_group_leader(
                group, bp.SEND_RUNS, [["capped", 0, raws, 16]])
            assert answers[0][0] == "SEND_OK", answers
            assert await created_queues(routes, "capped") == 4
            assert not (await routes.route("bad-count", refresh=True)).exists
        finally:
            await routes.close()

    asyncio.run(body())


def test_a_message_above_the_producers_maximum_is_refused_before_it_is_sent(ns: str) -> None:
    async def body() -> None:
        async with Producer(ns, max_message_size_bytes=1024) as p, \
                PullConsumer(ns, "sizes") as consumer:
            big = Message("sizes", b"x" * 2000)
            with pytest.raises(MessageTooLargeError, match="max_message_size_bytes"):
                await p.send(big)
            with pytest.raises(MessageTooLargeError, match="max_message_size_bytes"):
                p.send_oneway(big)
            with pytest.raises(MessageTooLargeError, match="max_message_size_bytes"):
                await p.send_batch([Message("sizes", b"x" * 600)] * 2)
            small = await p.send(Message("sizes", b"x" * 500))
            got = await consumer.pull(small.queue, 0, 32)
            assert [m.body for m in got.messages] == [b"x" * 500]  # the refused ones never left

    asyncio.run(body())


def test_the_broker_still_refuses_what_exceeds_its_own_maximum(ns: str) -> None:
    async def body() -> None:
        async with Producer(ns, max_message_size_bytes=1 << 20) as p:
            with pytest.raises(MessageTooLargeError) as raised:
                await p.send(Message("sizes-broker", b"x" * (BROKER_MAX_BYTES + 1)))
            assert "max_message_size_bytes" not in str(raised.value)  # the broker's refusal

    asyncio.run(body())


def test_the_blocking_producer_sends_oneway(ns: str) -> None:
    bodies = {b"oneway-%d" % i for i in range(5)}
    with SyncProducer(ns) as p:
        for body in sorted(bodies):
            assert p.send_oneway(Message("oneway", body)) is None
        with pytest.raises(MessageTooLargeError):
            p.send_oneway(Message("oneway", b"x" * (8 * 1024 * 1024 + 1)))
    with pytest.raises(ClientClosedError):  # closed: refused at once
        p.send_oneway(Message("oneway", b"late"))

    async def stored() -> set[bytes]:
        async with PullConsumer(ns, "oneway") as consumer:
            got: set[bytes] = set()

            async def all_there() -> bool:
                for mq in await consumer.fetch_queues("oneway"):
                    got.update(m.body for m in (await consumer.pull(mq, 0, 32)).messages)
                return got >= bodies
            await wait_until(all_there, 30, "the oneway messages")
            return got

    assert asyncio.run(stored()) == bodies
