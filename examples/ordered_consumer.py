"""Ordered messages, the consumer: the RocketMQ study notes' ordered messages chapter (a
``MessageListenerOrderly`` on ``OrderedProducer``'s topic).

An ``OrderlyPushConsumer`` locks each of its queues at the broker and hands the listener one
message at a time per queue, in queue order, so every order's steps arrive in the order they
were sent. It exits 0 once each of ``--count`` orders has reached its last step, in order;
a step out of order (one skipped, a later one first) is reported and makes it exit 1.
Run: ``python examples/ordered_consumer.py --count 10`` (after or alongside the producer).
"""

from __future__ import annotations

from support import Expect, arguments, consume, line, run

from client import ConsumeStatus, ReceivedMessage
from client.consumer.orderly import OrderlyPushConsumer

LAST_STEP = 3  # ordered_producer.py's steps: 0 created, 1 paid, 2 shipped, 3 done


async def main() -> int:
    args = arguments(__doc__, topic="TopicA", count=10, group="cg-ordered",
                     count_help="orders to wait for (each to its last step)").parse_args()
    expect = Expect(args.count)
    last: dict[str, int] = {}  # order id -> the last step seen

    def listener(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        for m in msgs:  # (one message at a time: an orderly listener's list holds one)
            props = dict(m.properties)
            order, step = props["order"], int(props["step"])
            seen = last.get(order, -1)
            print(f"order {order} step {step}: {line(m)}")
            if step == seen + 1:
                last[order] = step
                if step == LAST_STEP:
                    expect.got()
            elif step > seen:
                expect.fail(f"order {order}: step {step} after step {seen}")
            # step <= seen: a redelivery (at least once), already handled in order
        return ConsumeStatus.SUCCESS

    consumer = OrderlyPushConsumer(args.namesrv, args.group, listener, start_from="first")
    consumer.subscribe(args.topic, "*")
    return await consume(consumer, expect, args.timeout_s)


if __name__ == "__main__":
    run(main())
