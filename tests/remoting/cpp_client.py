"""A RocketMQ 4.x application: the C++ client (PyPI ``rocketmq-client-python``, a ctypes wrapper
around librocketmq) driven from the command line, one JSON line per event on stdout.

Runs in its own virtual environment (``tests.remoting.clients``), never imports dledger:

    python cpp_client.py produce --namesrv HOST:PORT --topic T --count N [--tags A] [--mode sync]
        (--mode batch: one SEND_BATCH_MESSAGE of N, with PyPI rocketmq 0.4.4's wrapper)
    python cpp_client.py consume --namesrv HOST:PORT --topic T --group G --expect N [--timeout-s S]
    python cpp_client.py transact --namesrv HOST:PORT --topic T --count N --linger-s S
        [--until-checked KEY,KEY]

``--access-key K`` signs a producer's requests (its secret from $CPP_SECRET_KEY).

``produce`` prints ``{"i", "msg_id", "offset", "queue"}`` per acknowledged send (``{"i",
"error"}`` per failed one); ``consume`` prints every message received with its topic, tags,
keys, body, properties and ids, and ends after ``--expect`` messages or ``--timeout-s``.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import threading
import time

from rocketmq.client import Message, Producer

try:
    from rocketmq.client import (
        ConsumeStatus,
        MessageModel,
        PushConsumer,
        TransactionMQProducer,
        TransactionStatus,
    )
except ImportError:  # PyPI rocketmq 0.4.4's wrapper: used here for batch sends only
    pass

# The C++ client (0.5.0rc2) fails a send at once, before anything leaves, when its own lock on
# its connection table is taken by another thread ("GetTransport ... get timed_mutex timeout" in
# its log; the transaction producer's oneway END and check-back threads take it): it reports "No
# route info of this topic". A sync or transaction producer sends such a message again, a few
# times, when the failure came at once (INSTANT_S: no request can have gone out and failed).
NO_TRANSPORT = "No route info of this topic"
TRANSPORT_RETRIES = 3
INSTANT_S = 0.1
PROPS = ("UNIQ_KEY", "color", "RETRY_TOPIC", "REAL_TOPIC", "DELAY")


def text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


def out(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def message(a: argparse.Namespace, i: int) -> Message:
    """Message i: key ``key-i``, the tags given, ``color`` red or blue, body ``hello i``."""
    msg = Message(a.topic)
    msg.set_keys(f"{a.key_prefix}{i}")
    msg.set_tags(a.tags)
    msg.set_property("color", "red" if i % 2 else "blue")
    msg.set_body(f"{a.body_prefix}{i}")
    return msg


def produce(a: argparse.Namespace) -> None:
    if a.mode == "batch":  # (PyPI rocketmq 0.4.4's wrapper: its Producer takes no orderly)
        producer = Producer(a.group, timeout=a.send_timeout_ms)
        producer.set_namesrv_addr(a.namesrv)
        producer.start()
        try:
            r = producer.send_batch([message(a, i) for i in range(a.count)])
            out({"batch": a.count, "status": int(r.status), "msg_id": r.msg_id,
                 "offset": r.offset})
        finally:
            producer.shutdown()
        return
    producer = Producer(a.group, orderly=a.mode == "orderly", timeout=a.send_timeout_ms)
    producer.set_namesrv_addr(a.namesrv)
    if a.access_key:  # (the secret from the environment: a command line is visible in ps)
        producer.set_session_credentials(a.access_key, os.environ["CPP_SECRET_KEY"], "")
    producer.start()
    try:
        for i in range(a.count):
            msg = message(a, i)
            if a.delay_level:
                msg.set_delay_time_level(a.delay_level)
            if a.interval_ms:
                time.sleep(a.interval_ms / 1000)  # the application's pace (a client's own wait)
            started = time.time()
            for attempt in range(1 + TRANSPORT_RETRIES):
                try:
                    if a.mode == "oneway":
                        producer.send_oneway(msg)
                        out({"i": i, "oneway": True})
                    elif a.mode == "orderly":
                        r = producer.send_orderly_with_sharding_key(msg, f"order-{i % a.shards}")
                    else:
                        r = producer.send_sync(msg)
                    if a.mode != "oneway":
                        out({"i": i, "status": int(r.status), "msg_id": r.msg_id,
                             "offset": r.offset, "sent_ms": int(started * 1000)})
                    break
                except Exception as err:  # counted by the caller: a failed send is an event
                    if (a.mode == "sync" and attempt < TRANSPORT_RETRIES
                            and NO_TRANSPORT in str(err) and time.time() - started < INSTANT_S):
                        print(f"send {i} again: {err}"[:300], file=sys.stderr, flush=True)
                        time.sleep(0.2)  # (failed at once on the client's own lock: not sent)
                        started = time.time()
                        continue
                    out({"i": i, "error": f"{type(err).__name__}: {err}"[:500]})
                    break
        if a.hold_s:  # (a oneway send returns before its bytes leave, and the shutdown closes
            out({"holding": True})  # the connections under writes still queued): until told
            select.select([sys.stdin], [], [], a.hold_s)  # (its stdin closed) or hold_s past
    finally:
        producer.shutdown()


def transact(a: argparse.Namespace) -> None:
    """Message i's local transaction: commit (i % 3 == 0), roll back (1), not known yet (2);
    asked by the check-back (about any of them: an END may come after the broker asks), the
    producer answers what it decided, the unknown ones commit; it stays until every key of
    ``--until-checked`` was asked about, at most ``--linger-s`` (the check-back reaches it only
    after its heartbeat reached the leader: the client heartbeats every 30 s)."""
    local = {0: TransactionStatus.COMMIT, 1: TransactionStatus.ROLLBACK,
             2: TransactionStatus.UNKNOWN}
    started = time.monotonic()
    awaited = {k for k in a.until_checked.split(",") if k}
    all_checked = threading.Event()

    def check(msg) -> TransactionStatus:  # type: ignore[no-untyped-def]
        out({"checked": text(msg.keys), "body": text(msg.body),
             "after_s": round(time.monotonic() - started, 1)})
        awaited.discard(text(msg.keys))
        if a.until_checked and not awaited:
            all_checked.set()
        i = int(text(msg.body).split()[-1])
        return TransactionStatus.ROLLBACK if i % 3 == 1 else TransactionStatus.COMMIT

    producer = TransactionMQProducer(a.group, check, timeout=a.send_timeout_ms)
    producer.set_namesrv_addr(a.namesrv)
    producer.start()
    try:
        for i in range(a.count):
            for attempt in range(1 + TRANSPORT_RETRIES):
                t0 = time.monotonic()
                try:
                    state = local[i % 3]
                    r = producer.send_message_in_transaction(message(a, i),
                                                             lambda m, _, s=state: s)
                    out({"i": i, "status": int(r.status), "msg_id": r.msg_id,
                         "local": int(state)})
                    break
                except Exception as err:  # counted by the caller
                    if (attempt < TRANSPORT_RETRIES and NO_TRANSPORT in str(err)
                            and time.monotonic() - t0 < INSTANT_S):
                        out({"retry": i, "error": f"{type(err).__name__}: {err}"[:500]})
                        time.sleep(0.2)  # (the client's lock is taken: an application's retry)
                        continue
                    out({"i": i, "error": f"{type(err).__name__}: {err}"[:500]})
        all_checked.wait(a.linger_s)  # the check-backs arrive meanwhile
    finally:
        producer.shutdown()


def consume(a: argparse.Namespace) -> None:
    model = MessageModel.BROADCASTING if a.broadcast else MessageModel.CLUSTERING
    consumer = PushConsumer(a.group, orderly=a.orderly, message_model=model)
    consumer.set_namesrv_addr(a.namesrv)
    if a.instance:
        consumer.set_instance_name(a.instance)
    seen = [0]
    done = threading.Event()
    fail_left = {"n": a.fail_first}
    lock = threading.Lock()

    def on_message(msg) -> ConsumeStatus:  # type: ignore[no-untyped-def]
        with lock:
            failing = fail_left["n"] > 0
            if failing:
                fail_left["n"] -= 1
            out({"topic": text(msg.topic), "tags": text(msg.tags), "keys": text(msg.keys),
                 "body": text(msg.body), "id": text(msg.id), "queue": msg.queue_id,
                 "offset": msg.queue_offset, "reconsume": msg.reconsume_times,
                 "recv_ms": int(time.time() * 1000), "failed": failing,
                 "props": {p: text(msg.get_property(p)) for p in PROPS}})
            if not failing:
                seen[0] += 1
                if seen[0] >= a.expect:
                    done.set()
        return ConsumeStatus.RECONSUME_LATER if failing else ConsumeStatus.CONSUME_SUCCESS

    consumer.subscribe(a.topic, on_message, a.expression)
    consumer.start()
    out({"started": True})
    done.wait(a.timeout_s)
    consumer.shutdown()
    out({"done": seen[0]})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["produce", "consume", "transact"])
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default="cpp-producer")
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--tags", default="TagA")
    p.add_argument("--key-prefix", default="key-")
    p.add_argument("--body-prefix", default="hello ")
    p.add_argument("--mode", choices=["sync", "oneway", "orderly", "batch"], default="sync")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--delay-level", type=int, default=0)
    p.add_argument("--send-timeout-ms", type=int, default=3000)
    p.add_argument("--expect", type=int, default=1)
    p.add_argument("--timeout-s", type=float, default=60.0)
    p.add_argument("--expression", default="*")
    p.add_argument("--orderly", action="store_true")
    p.add_argument("--broadcast", action="store_true")
    p.add_argument("--instance", default="")
    p.add_argument("--fail-first", type=int, default=0)
    p.add_argument("--linger-s", type=float, default=0.0)
    p.add_argument("--until-checked", default="")
    p.add_argument("--interval-ms", type=int, default=0)
    p.add_argument("--hold-s", type=float, default=0.0,
                   help="a producer stays up after its sends until its stdin closes, this long at most")
    p.add_argument("--access-key", default="")
    a = p.parse_args()
    {"produce": produce, "consume": consume, "transact": transact}[a.role](a)


if __name__ == "__main__":
    main()
