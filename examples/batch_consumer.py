"""Batch messages, the consumer: ``BatchConsumer`` of the RocketMQ study notes.

A push consumer whose listener gets up to ``consume_batch_max`` messages at once (RocketMQ's
``consumeMessageBatchMaxSize``, 1 by default; here 10), from pulls of up to
``pull_batch_max`` (``pullBatchSize``, 32 by default; here 40). One status answers for the
whole list: returning ``ConsumeStatus.LATER`` (RocketMQ's ``RECONSUME_LATER``) would
deliver all of them again. It prints a line per batch, then one per message, and exits 0
after ``--count`` messages. Run: ``python examples/batch_consumer.py --count 100``.
"""

from __future__ import annotations

from support import Expect, arguments, consume, line, run

from client import ConsumeStatus, PushConsumer, ReceivedMessage


async def main() -> int:
    parser = arguments(__doc__, topic="someTopic", count=100, group="cg-batch")
    parser.add_argument("--consume-batch-max", type=int, default=10)
    parser.add_argument("--pull-batch-max", type=int, default=40)
    args = parser.parse_args()
    expect = Expect(args.count)

    def listener(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        print(f"batch of {len(msgs)} message(s)")
        for m in msgs:
            print(line(m))
        if len(msgs) > args.consume_batch_max:
            expect.fail(f"a batch of {len(msgs)}, more than {args.consume_batch_max}")
        expect.got(len(msgs))
        return ConsumeStatus.SUCCESS  # for the whole batch (LATER: all of it again)

    consumer = PushConsumer(args.namesrv, args.group, listener, start_from="first",
                            consume_batch_max=args.consume_batch_max,
                            pull_batch_max=args.pull_batch_max)
    consumer.subscribe(args.topic, "*")
    return await consume(consumer, expect, args.timeout_s)


if __name__ == "__main__":
    run(main())
