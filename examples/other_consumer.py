"""Delayed messages, the consumer: ``OtherConsumer`` of the RocketMQ study notes.

A plain push consumer of ``DelayProducer``'s topic, from the first offset. It prints the time
each message is consumed and how long after its send that was (``delayed_ms``), which is never
less than the message's delay. It exits 0 after ``--count`` messages; with ``--min-delay-ms``
a message consumed sooner than that after its send is reported and makes it exit 1.
Run: ``python examples/other_consumer.py --count 10``, then the producer.
"""

from __future__ import annotations

import time

from support import Expect, arguments, clock, consume, line, run

from client import ConsumeStatus, PushConsumer, ReceivedMessage


async def main() -> int:
    parser = arguments(__doc__, topic="TopicB", count=10, group="cg-delay")
    parser.add_argument("--min-delay-ms", type=int, default=0,
                        help="the least delay expected from a message's send to its consumption")
    args = parser.parse_args()
    expect = Expect(args.count)

    def listener(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        for m in msgs:
            delayed_ms = int(time.time() * 1000) - m.born_ts_ms
            print(f"{clock()} ,{line(m)} delayed_ms={delayed_ms}")  # when it was consumed
            if delayed_ms < args.min_delay_ms:
                expect.fail(f"{m.msg_id} consumed {delayed_ms} ms after its send")
            expect.got()
        return ConsumeStatus.SUCCESS

    consumer = PushConsumer(args.namesrv, args.group, listener, start_from="first")
    consumer.subscribe(args.topic, "*")
    return await consume(consumer, expect, args.timeout_s)


if __name__ == "__main__":
    run(main())
