"""Batch messages, the producer: ``BatchProducer`` and ``MessageListSplitter`` of the RocketMQ
study notes.

A batch (one ``send_batch``) goes to one queue as one request and is stored all or nothing; it
must hold at most the broker's maximum (4 MiB by default), counted as RocketMQ counts it. The
Java ``MessageListSplitter`` cuts a long list into batches that fit: here that is
``client.split_batch`` (sizes by ``client.message_bytes``: topic, body, properties, 20 bytes
a message). ``--pad-bytes`` makes the bodies large enough to see it cut (100 messages of
50000 bytes are two batches). Run: ``python examples/batch_producer.py --count 100``.
"""

from __future__ import annotations

import sys

from support import arguments, sent

from client import Message, SyncProducer, message_bytes, split_batch


def main() -> int:
    parser = arguments(__doc__, topic="someTopic", count=100)
    parser.add_argument("--pad-bytes", type=int, default=0,
                        help="bytes added to each body, to see the list split")
    parser.add_argument("--batch-bytes", type=int, default=4 * 1024 * 1024,
                        help="the splitter's limit (the broker's --max-message-bytes)")
    args = parser.parse_args()
    messages = [Message(args.topic, f"Hi,{i}".encode() + b"." * args.pad_bytes, tags="someTag")
                for i in range(args.count)]
    with SyncProducer(args.namesrv) as producer:
        for batch in split_batch(messages, args.batch_bytes):  # the MessageListSplitter
            results = producer.send_batch(batch)
            size = sum(message_bytes(m) for m in batch)
            print(f"batch of {len(batch)} message(s), {size} bytes: {sent(results[0])} .. "
                  f"queue_offset={results[-1].queue_offset}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
