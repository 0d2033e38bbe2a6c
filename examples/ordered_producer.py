"""Ordered messages, the producer: ``OrderedProducer`` of the RocketMQ study notes.

Each order's messages go to the queue its order id selects (``MessageQueueSelector``: the id
modulo the queue count), one send after the other, so that they are stored in that queue in
the order they were sent. The Java example sends one message per order id; here each order
has four steps (created, paid, shipped, done), sent step by step over all orders, so that the
queues interleave orders and the consumer (``ordered_consumer.py``) can show each order's
steps in order. Run: ``python examples/ordered_producer.py --count 10``.
"""

from __future__ import annotations

from support import arguments, run, sent

from client import Message, MessageQueue, Producer

STEPS = ("created", "paid", "shipped", "done")


def select(queues: list[MessageQueue], message: Message, order_id: str) -> MessageQueue:
    """The Java example's ``MessageQueueSelector.select``: the order id modulo the queue count.
    (``client.producer.producer.hash_selector``, the default, hashes any key instead.)"""
    return queues[int(order_id) % len(queues)]


async def main() -> int:
    args = arguments(__doc__, topic="TopicA", count=10,
                     count_help="orders to send (each in four steps)").parse_args()
    async with Producer(args.namesrv) as producer:
        for step, what in enumerate(STEPS):
            for order_id in range(args.count):
                body = f"Hi,{order_id} step {step} {what}".encode()
                msg = Message(args.topic, body, tags="TagA", keys=f"order-{order_id}",
                              properties={"order": str(order_id), "step": str(step)})
                # awaited before the next send: RocketMQ's rule for ordered sends
                result = await producer.send_orderly(msg, str(order_id), select)
                print(f"order {order_id} step {step} {what}: {sent(result)}")
    return 0


if __name__ == "__main__":
    run(main())
