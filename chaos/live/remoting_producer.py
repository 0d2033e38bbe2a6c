"""A RocketMQ 4.x producer in a live chaos run: the C++ client's Python wrapper
(``rocketmq-client-python``, the clients' environment of ``make clients``) sending values
``<proc>-<seq>`` to the chaos topic one at a time, given only the NameServer's address. Runs in
that environment and imports nothing of dledger: ``chaos.live.remoting`` starts it and turns its
lines into the run's history.

    python remoting_producer.py NAMESRV TOPIC PROC PAUSE_S SEED

One JSON line per event, each stamped with this process's wall clock (``t``): ``invoke`` before a
send, then ``ok`` (its queue offset) or ``info`` (the client raised: the outcome is unknown, the
message may be stored). SIGTERM ends it after the send under way. A body is the value, ``|`` and
padding derived from the value (``chaos.live.workload.body_of``'s form), so the drain can tell a
damaged body.
"""

import hashlib
import json
import random
import signal
import sys
import time

from rocketmq.client import Message, Producer

stopping: list[bool] = []


def filler(value: bytes, size: int) -> bytes:
    seed = hashlib.sha256(value).hexdigest().encode()
    return (seed * (size // len(seed) + 1))[:size]


def out(**event: object) -> None:
    event["t"] = time.time()
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def main() -> None:
    namesrv, topic, proc, pause_s, seed = sys.argv[1:6]
    rng = random.Random(int(seed))
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    producer = Producer(f"chaos-4x-{proc}", timeout=3000)
    producer.set_namesrv_addr(namesrv)
    producer.start()
    out(type="ready")
    seq = 0
    try:
        while not stopping:
            value = f"{proc}-{seq}"
            seq += 1
            raw = value.encode()
            msg = Message(topic)
            msg.set_body(raw + b"|" + filler(raw, max(0, rng.randint(64, 256) - len(raw) - 1)))
            out(type="invoke", value=value)
            try:
                r = producer.send_sync(msg)
            except Exception as err:  # the client's own errors: the outcome is unknown
                out(type="info", value=value, error=type(err).__name__)
            else:
                out(type="ok", value=value, offset=r.offset, status=int(r.status))
            time.sleep(float(pause_s))  # pacing the offered load (the workload's own)
    finally:
        producer.shutdown()


if __name__ == "__main__":
    main()
