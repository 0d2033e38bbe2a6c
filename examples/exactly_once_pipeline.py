"""Exactly-once consume-transform-produce (beyond RocketMQ, as Kafka's transactions): read a topic
as a consumer group, write one transformed message per input to another topic, and commit each
batch's outputs together with the group's offset in one transaction, so that a crash, a leader
change or a second instance never makes an input's output appear twice or not at all.

It reads ``--topic`` (``PipeIn``) as group ``--group`` (``cg-pipeline``), writes each body
upper-cased to ``--target`` (``PipeOut``), and exits once ``--count`` inputs are committed (or
``--timeout-s`` passes). Kill it with ``kill -9`` half way and run it again: the outputs are
still one per input. Run: ``dledger send PipeIn a b c`` then
``python examples/exactly_once_pipeline.py --count 3``, and ``dledger consume PipeOut``.
"""

from __future__ import annotations

import asyncio
import time

from support import arguments, run

from client import Message, Pipeline, ReceivedMessage


async def main() -> int:
    parser = arguments(__doc__, topic="PipeIn", count=3, group="cg-pipeline")
    parser.add_argument("--target", default="PipeOut", help="the topic the outputs go to")
    args = parser.parse_args()

    def transform(m: ReceivedMessage) -> list[Message]:  # may run twice; visible once
        return [Message(args.target, m.body.upper(), keys=[m.msg_id])]

    async with Pipeline(args.namesrv, args.group, args.topic, transform) as pipeline:
        stop = asyncio.Event()
        worker = asyncio.create_task(pipeline.run(stop))
        deadline = time.monotonic() + args.timeout_s
        try:
            while pipeline.committed_inputs < args.count and time.monotonic() < deadline:
                await asyncio.sleep(0.2)  # polling the pipeline's own count
        finally:
            stop.set()
            await worker
        print(f"committed {pipeline.committed_inputs} inputs, "
              f"{pipeline.conflicts} batches committed elsewhere first, lag {await pipeline.lag()}")
        return 0 if pipeline.committed_inputs >= args.count else 1


if __name__ == "__main__":
    run(main())
