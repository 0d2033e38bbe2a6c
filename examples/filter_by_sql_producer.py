"""SQL filtering, the producer: ``FilterBySQLProducer`` of the RocketMQ study notes.

Sends ``--count`` messages, each with the user property ``age`` set to its number (the Java
``msg.putUserProperty("age", i + "")``: ``Message(..., properties={"age": "3"})``; property
values are strings, compared as numbers by a numeric SQL expression), for
``filter_by_sql_consumer.py`` to select by.
Run: ``python examples/filter_by_sql_producer.py --count 10``.
"""

from __future__ import annotations

import sys

from support import arguments, sent

from client import ClientError, Message, SyncProducer


def main() -> int:
    args = arguments(__doc__, topic="myTopic", count=10).parse_args()
    failed = 0
    with SyncProducer(args.namesrv) as producer:
        for i in range(args.count):
            body = f"Hi,{i}".encode()
            msg = Message(args.topic, body, tags="myTag", properties={"age": str(i)})
            try:  # as the Java example: one failed send is printed, the others still go
                print(sent(producer.send(msg)))
            except ClientError as err:
                print(f"message {i} not sent: {type(err).__name__}: {err}", file=sys.stderr)
                failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
