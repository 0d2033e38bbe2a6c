"""Delayed messages, the producer: ``DelayProducer`` of the RocketMQ study notes.

Each message is stored at once but stays invisible to consumers until its delay has passed:
``Message(delay_level=3)`` is the Java ``msg.setDelayTimeLevel(3)`` (10 s with the broker's
default levels ``1s 5s 10s 30s 1m ...``, its ``--delay-levels``), ``--delay-ms`` a delay of any
length instead (RocketMQ 5's timer messages). It prints the time each message was sent; run
``other_consumer.py`` to see when each one is consumed.
Run: ``python examples/delay_producer.py --count 10 --delay-level 3``.
"""

from __future__ import annotations

import sys

from support import arguments, clock, sent

from client import Message, SyncProducer


def main() -> int:
    parser = arguments(__doc__, topic="TopicB", count=10)
    parser.add_argument("--delay-level", type=int, default=3,
                        help="1..18 (the broker's delay levels); 0: not delayed")
    parser.add_argument("--delay-ms", type=int, default=None,
                        help="instead of a level: deliver this many ms from now")
    args = parser.parse_args()
    with SyncProducer(args.namesrv) as producer:
        for i in range(args.count):
            body = f"Hi,{i}".encode()
            msg = Message(args.topic, body, tags="someTag",
                          delay_level=args.delay_level if args.delay_ms is None else 0,
                          delay_ms=args.delay_ms)
            result = producer.send(msg)
            print(f"{clock()} ,{sent(result)}")  # when the message was sent
    return 0


if __name__ == "__main__":
    sys.exit(main())
