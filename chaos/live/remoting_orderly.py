"""RocketMQ 4.x orderly messaging in a live chaos run: the C++ client's Python wrapper (the
clients' environment of ``make clients``) as an orderly producer or an orderly push consumer
member, given only the NameServer's address. Runs in that environment and imports nothing of
dledger: ``chaos.live.remoting`` starts it and reads its lines.

    python remoting_orderly.py produce NAMESRV TOPIC GROUP ORDER_IDS PAUSE_S
    python remoting_orderly.py consume NAMESRV TOPIC GROUP MEMBER

``produce`` sends ``<order id>:<seq>`` with the order id as sharding key, the order ids in turn;
a send the client raised on is sent again (the same seq) until acknowledged, and only then does
that order id move on: ``{"type": "acked", "order", "seq"}`` per acknowledgement. ``consume``
prints each listener call: ``{"type": "proc", "member", "queue", "offset", "order", "seq",
"start_ns", "end_ns"}`` (CLOCK_MONOTONIC, comparable between the processes of one machine).
Both print ``{"type": "ready"}`` once started; SIGTERM ends them.
"""

import json
import signal
import sys
import threading
import time

from rocketmq.client import ConsumeStatus, Message, Producer, PushConsumer

stopping = threading.Event()


def out(**event: object) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def produce(namesrv: str, topic: str, group: str, ids: int, pause_s: float) -> None:
    producer = Producer(group, orderly=True, timeout=3000)
    producer.set_namesrv_addr(namesrv)
    producer.start()
    out(type="ready")
    seqs = [0] * ids
    try:
        while not stopping.is_set():
            for k in range(ids):
                oid = f"x{k}"
                msg = Message(topic)
                msg.set_body(f"{oid}:{seqs[k]}")
                try:
                    producer.send_orderly_with_sharding_key(msg, oid)
                except Exception as err:  # the outcome unknown: the same seq again next round
                    out(type="info", order=oid, seq=seqs[k], error=type(err).__name__)
                    continue
                out(type="acked", order=oid, seq=seqs[k])
                seqs[k] += 1
            stopping.wait(pause_s)  # pacing the offered load
    finally:
        producer.shutdown()


def consume(namesrv: str, topic: str, group: str, member: str) -> None:
    consumer = PushConsumer(group, orderly=True)
    consumer.set_namesrv_addr(namesrv)
    consumer.set_instance_name(member)

    def listener(msg) -> ConsumeStatus:  # type: ignore[no-untyped-def]
        start = time.monotonic_ns()
        time.sleep(0.005)  # the work: a processing interval
        order, _, seq = msg.body.decode(errors="replace").partition(":")
        out(type="proc", member=member, queue=msg.queue_id, offset=msg.queue_offset,
            order=order, seq=int(seq) if seq.isdigit() else -1, start_ns=start,
            end_ns=time.monotonic_ns())
        return ConsumeStatus.CONSUME_SUCCESS

    consumer.subscribe(topic, listener)
    consumer.start()
    out(type="ready")
    stopping.wait()
    consumer.shutdown()


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    role, namesrv, topic, group = sys.argv[1:5]
    if role == "produce":
        produce(namesrv, topic, group, int(sys.argv[5]), float(sys.argv[6]))
    else:
        consume(namesrv, topic, group, sys.argv[5])


if __name__ == "__main__":
    main()
