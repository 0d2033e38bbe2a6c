"""Tag filtering, the consumer: ``FilterByTagConsumer`` of the RocketMQ study notes.

Subscribes with the tag expression ``myTagA || myTagB`` (``*`` is every tag): the broker skips
other tags by their hash in the consume queue, the client checks the tag exactly, and the
listener sees only those two. Of ``FilterByTagProducer``'s 10 messages that is 7, the
default ``--count``; a message with another tag is reported and makes it exit 1.
Run: ``python examples/filter_by_tag_consumer.py`` (after or alongside the producer).
"""

from __future__ import annotations

from support import Expect, arguments, consume, line, run

from client import ConsumeStatus, PushConsumer, ReceivedMessage


async def main() -> int:
    parser = arguments(__doc__, topic="myTopic", count=7, group="cg-tag")
    parser.add_argument("--tags", default="myTagA || myTagB", help="the tag expression")
    args = parser.parse_args()
    wanted = {t.strip() for t in args.tags.split("||")}
    expect = Expect(args.count)

    def listener(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        for m in msgs:
            print(line(m))
            if "*" not in wanted and m.tags not in wanted:
                expect.fail(f"tag {m.tags!r} is not in {args.tags!r}")
            expect.got()
        return ConsumeStatus.SUCCESS

    consumer = PushConsumer(args.namesrv, args.group, listener, start_from="first")
    consumer.subscribe(args.topic, args.tags)
    return await consume(consumer, expect, args.timeout_s)


if __name__ == "__main__":
    run(main())
