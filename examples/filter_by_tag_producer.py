"""Tag filtering, the producer: ``FilterByTagProducer`` of the RocketMQ study notes.

Sends ``--count`` messages whose tags cycle through ``myTagA``, ``myTagB``, ``myTagC``, for
``filter_by_tag_consumer.py`` to pick two of them.
Run: ``python examples/filter_by_tag_producer.py --count 10``.
"""

from __future__ import annotations

import sys

from support import arguments, sent

from client import Message, SyncProducer

TAGS = ("myTagA", "myTagB", "myTagC")


def main() -> int:
    args = arguments(__doc__, topic="myTopic", count=10).parse_args()
    with SyncProducer(args.namesrv) as producer:
        for i in range(args.count):
            body = f"Hi,{i}".encode()
            tag = TAGS[i % len(TAGS)]
            result = producer.send(Message(args.topic, body, tags=tag))
            print(sent(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
