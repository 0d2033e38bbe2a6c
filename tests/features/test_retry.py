"""Retry and dead letters (the issue's item 1): the send-back copy's rules
(``broker.features.retry.model``), and on real processes a push consumer that fails a message three
times then succeeds (four deliveries, delay levels 3, 4, 5, its offset moving on), one that always
fails (the message in ``%DLQ%<group>`` after ``max_reconsume_times`` reconsumes with its topic and
msg id kept), and ``dledger dlq list|resend`` and ``dledger consumer retry``."""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict

import pytest
from click.testing import CliRunner

from broker.features.retry.model import resent_from_dlq, send_back
from cli import main as cli_main
from client import (
    ConsumeStatus,
    Message,
    Producer,
    PullConsumer,
    PushConsumer,
    ReceivedMessage,
    TopicNotFoundError,
)
from tests.clusters import namesrv_group
from tests.nodes.test_processes import wait_until

# level 3, 4, 5 = 200, 300, 400 ms (the test's shortened levels; RocketMQ's are 10 s, 30 s, 1 m)
LEVELS = "50ms 100ms 200ms 300ms 400ms " + " ".join(["500ms"] * 13)
pytestmark = pytest.mark.slow  # (the first test is pure; the rest start processes)
FAST = dict(heartbeat_s=0.3, rebalance_s=0.5, commit_s=0.3, suspend_ms=300, start_from="first")


def stored(props: list[list[str]], key: str = "K") -> list:
    return [b"body", "TagA", ["k1"], key, props, 7]


def test_a_send_back_copies_the_message_with_rocketmqs_properties() -> None:
    first = send_back("g", stored([["user", "1"]]), "orders", "a-00-0", 0, 16)
    assert (first.topic, first.reconsume_times, first.dead) == ("%RETRY%g", 1, False)
    body, tags, keys, key, props, born = first.message
    assert (body, tags, keys, born) == (b"body", "TagA", ["k1"], 7)
    assert dict(map(tuple, props)) == {"user": "1", "RETRY_TOPIC": "orders",
                                      "ORIGIN_MESSAGE_ID": "a-00-0", "UNIQ_KEY": "K",
                                      "RECONSUME_TIME": "1", "DELAY": "3"}
    assert key == "K#g#a-00-0"  # a retried send-back of this copy is a duplicate
    # the retry copy fails again: read from the retry topic, level 4, the origin kept
    as_stored = [*first.message[:4], [*props, ["REAL_TOPIC", "%RETRY%g"], ["REAL_QID", "0"],
                                       ["TIMER_DELIVER_MS", "9"]], 7]
    second = send_back("g", as_stored, "%RETRY%g", "a-10-0", 0, 16)
    named = dict(map(tuple, second.message[4]))
    assert named["RETRY_TOPIC"] == "orders" and named["ORIGIN_MESSAGE_ID"] == "a-00-0"
    assert named["UNIQ_KEY"] == "K" and named["RECONSUME_TIME"] == "2" and named["DELAY"] == "4"
    assert "REAL_TOPIC" not in named and "TIMER_DELIVER_MS" not in named
    assert second.message[3] == "K#g#a-10-0"  # another copy: another message
    dead = send_back("g", stored([["RECONSUME_TIME", "16"]]), "%RETRY%g", "a-20-0", 0, 16)
    assert (dead.topic, dead.reconsume_times, dead.dead) == ("%DLQ%g", 16, True)
    assert "DELAY" not in dict(map(tuple, dead.message[4]))
    assert send_back("g", stored([]), "t", "x", -1, 16).dead  # level -1: straight to the DLQ
    other_group = send_back("h", stored([["user", "1"]]), "orders", "a-00-0", 0, 16)
    assert other_group.message[3] != key  # each group that fails it gets its own retry copy
    again = resent_from_dlq(dead.message, "a-30-0")
    assert dict(map(tuple, again[4]))["RECONSUME_TIME"] == "0" and again[3] == "K#a-30-0"


class Failing:
    """Fails each message ``fails`` times (-1: always), recording every delivery."""

    def __init__(self, fails: int) -> None:
        self.fails = fails
        self.deliveries: dict[str, list[ReceivedMessage]] = defaultdict(list)

    def __call__(self, batch: list[ReceivedMessage]) -> ConsumeStatus:
        for m in batch:
            self.deliveries[m.msg_id].append(m)
        m = batch[0]
        if self.fails < 0 or len(self.deliveries[m.msg_id]) <= self.fails:
            return ConsumeStatus.LATER
        return ConsumeStatus.SUCCESS


@pytest.fixture(scope="module")
def ns(tmp_path_factory: pytest.TempPathFactory):
    with namesrv_group(tmp_path_factory.mktemp("retry"), "--delay-levels", LEVELS) as (addr, _):
        yield addr


def test_three_failures_then_success_is_four_deliveries_and_the_offset_moves_on(ns: str) -> None:
    async def run() -> None:
        async with Producer(ns) as producer:
            sent = await producer.send(Message("retried", b"flaky", keys="order-1"))
            listener = Failing(fails=3)
            c = PushConsumer(ns, "flaky-group", listener, **FAST)
            c.subscribe("retried")
            async with await c.start():
                await wait_until(lambda: len(listener.deliveries[sent.msg_id]) >= 4, 30,
                                 "the fourth delivery")
                async with PullConsumer(ns, "flaky-group") as pc:
                    async def moved_on() -> bool:
                        return await pc.committed(sent.queue) > sent.queue_offset
                    await wait_until(moved_on, 20, "the group's offset past the message")
            got = listener.deliveries[sent.msg_id]
            assert len(got) == 4, [m.queue for m in got]
            assert [m.reconsume_times for m in got] == [0, 1, 2, 3]
            assert [dict(m.properties).get("DELAY") for m in got] == [None, "3", "4", "5"]
            assert all(m.topic == "retried" and m.keys == ("order-1",) for m in got)
            assert [m.queue.topic for m in got] == ["retried"] + ["%RETRY%flaky-group"] * 3
            for earlier, later in itertools.pairwise(got[1:]):  # each retry due later than the last
                assert int(dict(later.properties)["TIMER_DELIVER_MS"]) > \
                    int(dict(earlier.properties)["TIMER_DELIVER_MS"])
    asyncio.run(run())


def test_always_failing_goes_to_the_dlq_and_dlq_resend_brings_it_back(ns: str) -> None:
    async def run() -> tuple[str, Failing]:
        async with Producer(ns) as producer:
            sent = await producer.send(Message("doomed", b"poison", tags="TagP",
                                               properties={"p": "1"}))
            listener = Failing(fails=-1)
            c = PushConsumer(ns, "doomed-group", listener, max_reconsume_times=2, **FAST)
            c.subscribe("doomed")
            async with await c.start(), PullConsumer(ns, "doomed-group") as pc:
                async def dead() -> bool:
                    try:
                        return bool(await pc.fetch_queues("%DLQ%doomed-group", wait=False))
                    except TopicNotFoundError:  # not there yet
                        return False
                await wait_until(dead, 30, "the dead-letter topic")
                dlq = (await pc.fetch_queues("%DLQ%doomed-group"))[0]
                letters = (await pc.pull(dlq, 0, 10)).messages
            assert len(listener.deliveries[sent.msg_id]) == 3  # the original + 2 reconsumes
            (letter,) = letters
            assert letter.msg_id == sent.msg_id and letter.topic == "doomed"
            assert letter.tags == "TagP" and dict(letter.properties)["p"] == "1"
            assert letter.reconsume_times == 2
            assert dict(letter.properties)["ORIGIN_MESSAGE_ID"] == sent.offset_msg_id
            return sent.msg_id, listener

    msg_id, _ = asyncio.run(run())
    runner = CliRunner()
    listed = runner.invoke(cli_main, ["dlq", "list", "--namesrv", ns, "doomed-group"])
    assert listed.exit_code == 0, listed.output
    assert msg_id in listed.output and "topic doomed" in listed.output
    status = runner.invoke(cli_main, ["consumer", "retry", "--namesrv", ns, "doomed-group"])
    assert status.exit_code == 0 and "%DLQ%doomed-group" in status.output, status.output
    resent = runner.invoke(cli_main, ["dlq", "resend", "--namesrv", ns, "doomed-group"])
    assert resent.exit_code == 0 and "1 dead letter(s) resent" in resent.output, resent.output

    async def comes_back() -> None:  # a healed consumer of the group gets it once more
        listener = Failing(fails=0)
        c = PushConsumer(ns, "doomed-group", listener, max_reconsume_times=2, **FAST)
        c.subscribe("doomed")
        async with await c.start():
            await wait_until(lambda: listener.deliveries.get(msg_id), 30, "the resent letter")
        (again,) = listener.deliveries[msg_id]
        assert again.reconsume_times == 0 and again.queue.topic == "%RETRY%doomed-group"
    asyncio.run(comes_back())
