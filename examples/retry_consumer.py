"""Consumption retry: the RocketMQ study notes' retry chapter (``setMaxReconsumeTimes(10)`` and
the three ways a concurrent listener asks for a message again).

In clustering, a message the listener fails is sent back to the broker and comes again from
``%RETRY%<group>`` after a growing delay (delay level 3 + its reconsume times: 10 s, 30 s,
1 m ... with the broker's default levels); after ``max_reconsume_times`` reconsumes (16 by
default, here 10) it goes to the dead-letter topic ``%DLQ%<group>`` instead. The listener
fails each message ``--fail-times`` times, one way after the other, as the notes list them:

1. it returns ``ConsumeStatus.LATER`` (the Java ``RECONSUME_LATER``, the recommended way);
2. it returns ``None`` (``null``);
3. it raises an exception (the library logs it);

then returns ``SUCCESS``. Each delivery prints its ``reconsume_times`` (0, 1, 2, 3) and what
the listener answered. The notes have no producer for this chapter: this example first sends
``--count`` messages itself (``--no-send``: only consume). It exits 0 once every message has
succeeded. With the default levels, three failures take 10 + 30 + 60 s.
Run: ``python examples/retry_consumer.py``.
"""

from __future__ import annotations

from support import Expect, arguments, consume, line, run, sent

from client import ConsumeStatus, Message, Producer, PushConsumer, ReceivedMessage


async def main() -> int:
    parser = arguments(__doc__, topic="TopicC", count=1, group="cg-retry", timeout_s=180.0,
                       count_help="messages to send, then to wait for until each succeeds")
    parser.add_argument("--fail-times", type=int, default=3,
                        help="failures before each message succeeds (at most 10, else it is "
                             "a dead letter and never succeeds here)")
    parser.add_argument("--no-send", action="store_true", help="consume only")
    args = parser.parse_args()
    if not args.no_send:
        async with Producer(args.namesrv) as producer:
            for i in range(args.count):
                print(sent(await producer.send(Message(args.topic, f"Hi,{i}".encode()))))
    expect = Expect(args.count)
    succeeded: set[str] = set()

    def listener(msgs: list[ReceivedMessage]) -> ConsumeStatus | None:
        (m,) = msgs  # one at a time (consume_batch_max=1, the default)
        if m.reconsume_times >= args.fail_times:
            print(f"{line(m)} -> CONSUME_SUCCESS")
            if m.msg_id not in succeeded:  # (a redelivery after a rebalance counts once)
                succeeded.add(m.msg_id)
                expect.got()
            return ConsumeStatus.SUCCESS
        way = m.reconsume_times % 3
        print(f"{line(m)} -> {('RECONSUME_LATER', 'null', 'exception')[way]}")
        if way == 0:
            return ConsumeStatus.LATER
        if way == 1:
            return None
        raise RuntimeError(f"failed on purpose, reconsume_times={m.reconsume_times}")

    consumer = PushConsumer(args.namesrv, args.group, listener, start_from="first",
                            max_reconsume_times=10)
    consumer.subscribe(args.topic, "*")
    return await consume(consumer, expect, args.timeout_s)


if __name__ == "__main__":
    run(main())
