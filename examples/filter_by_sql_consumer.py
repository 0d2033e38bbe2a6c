"""SQL filtering, the consumer: ``FilterBySQLConsumer`` of the RocketMQ study notes.

Subscribes with the SQL92 expression ``age between 0 and 6`` (the Java
``MessageSelector.bySql``): the broker evaluates it on each message's user properties and
sends only the messages for which it is TRUE; a message without ``age`` is not one of them
(comparisons with a missing property are UNKNOWN). Numbers, 'strings', TRUE/FALSE, NULL; >,
>=, <, <=, BETWEEN, =, <>, IN, IS [NOT] NULL, AND, OR, NOT. A malformed expression is refused
at ``subscribe`` with ``BadFilterError``. Of ``FilterBySQLProducer``'s 10 messages, 7 match
(ages 0-6), the default ``--count`` (``--low`` and ``--high`` change the range); a message
outside the range is reported and makes it exit 1.
Run: ``python examples/filter_by_sql_consumer.py`` (after or alongside the producer).
"""

from __future__ import annotations

from support import Expect, arguments, consume, line, run

from client import ConsumeStatus, PushConsumer, ReceivedMessage


async def main() -> int:
    parser = arguments(__doc__, topic="myTopic", count=7, group="cg-sql")
    parser.add_argument("--low", type=int, default=0, help="the least age selected")
    parser.add_argument("--high", type=int, default=6, help="the greatest age selected")
    args = parser.parse_args()
    sql = f"age between {args.low} and {args.high}"
    expect = Expect(args.count)

    def listener(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        for m in msgs:
            print(line(m))
            age = dict(m.properties).get("age", "")
            if not (age.lstrip("-").isdigit() and args.low <= int(age) <= args.high):
                expect.fail(f"age {age!r} does not match {sql!r}")
            expect.got()
        return ConsumeStatus.SUCCESS

    consumer = PushConsumer(args.namesrv, args.group, listener, start_from="first")
    consumer.subscribe(args.topic, sql=sql)  # (a malformed one: client.errors.BadFilterError)
    return await consume(consumer, expect, args.timeout_s)


if __name__ == "__main__":
    run(main())
