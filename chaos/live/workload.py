"""The client side of a live chaos run (docs/testing.md): the recorded history, producers, consumers,
and the final drain of every replica.

- ``History``: one JSON object per event (Appendix A's format; ``t`` is wall-clock seconds, as the
  nodes' traces use wall-clock time), kept in memory and appended to a file as it happens.
- Producers: each sends ``p<k>-<seq>`` values through the real client library (``Producer``), one
  at a time, recording invoke -> ok (queue, offset, node) | fail (certainly not stored) | info
  (outcome unknown). A value is never resent by the workload; the library's own retries reuse
  the message's unique key, which the broker deduplicates. Every ``SHARED_KEY_EVERY``-th value
  goes under a unique key every producer uses for its value of that number (``send_keyed``):
  each of them must be stored, none taken for another's retry (the broker deduplicates by key
  and content; a key is no secret). A lone producer (S16's) shares no key: it sends as it did.
- Consumers: two per queue, through the real ``PullConsumer``: one tails the queue from 0 (and
  every 2 s commits its offset to the broker and reads it back through the leader), one re-reads
  the queue from 0 every few seconds (a new session each time).
- ``drain``: after the heal, every queue read from each replica alone and through the leader.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import random
import time
from collections.abc import Iterator
from typing import IO, Any

from client import errors
from client.consumer.pull import PullConsumer
from client.producer.producer import Producer
from client.types import Message, MessageQueue
from dledger.client import LogClient
from protocol import broker_kinds as bp
from protocol.errors import DLedgerError

TOPIC = "chaos"
QUEUES = 4
SHARED_KEY_EVERY = 8  # a producer's every 8th value goes under a key all producers share
COMMIT_EVERY_S = 2.0  # tail consumers commit their offset and read it back this often


class History:
    def __init__(self, path: str) -> None:
        self.events: list[dict[str, Any]] = []
        self._f: IO[str] = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def add(self, **event: Any) -> dict[str, Any]:
        return self.add_at(time.time(), **event)

    def add_at(self, t: float, **event: Any) -> dict[str, Any]:
        """An event that happened at wall-clock ``t`` (another process's, read later)."""
        event["t"] = t
        self.events.append(event)
        self._f.write(json.dumps(event) + "\n")
        return event

    def close(self) -> None:
        self._f.close()


def _filler(value: bytes, size: int) -> bytes:
    """Padding that depends on the value, so a reader can verify the whole body."""
    seed = hashlib.sha256(value).hexdigest().encode()
    return (seed * (size // len(seed) + 1))[:size]


def body_of(value: str, rng: random.Random) -> bytes:
    """The message body, 64-256 bytes: the value, a separator, padding derived from the value."""
    raw = value.encode()
    return raw + b"|" + _filler(raw, max(0, rng.randint(64, 256) - len(raw) - 1))


def value_of(body: bytes) -> str:
    """The value a body carries; a body damaged anywhere reads as ``<value>!corrupt`` (a value
    never sent, which the checkers report as unexpected)."""
    raw, sep, pad = body.partition(b"|")
    value = raw.decode(errors="replace")
    if not sep or pad != _filler(raw, len(pad)):
        return f"{value}!corrupt"
    return value


async def producer(history: History, namesrv: str, pid: int, stop: asyncio.Event,
                   pause_s: float, rng: random.Random, timeout_s: float = 3.0,
                   canaries: tuple[str, ...] = (), shared_keys: bool = True) -> None:
    proc = f"p{pid}"
    async with Producer(namesrv, send_timeout_s=timeout_s, canaries=canaries) as prod:
        seq = 0
        while not stop.is_set():
            value = f"{proc}-{seq}"
            seq += 1
            history.add(proc=proc, type="invoke", f="send", value=value)
            message = Message(TOPIC, body_of(value, rng))
            try:
                sent = prod.send_keyed(message, f"shared-{seq - 1}") \
                    if shared_keys and (seq - 1) % SHARED_KEY_EVERY == 0 else prod.send(message)
                r = await asyncio.wait_for(sent, timeout_s + 2)
            except (errors.RetriableError, errors.NonRetriableError) as err:
                history.add(proc=proc, type="fail", f="send", value=value, error=_name(err))
            except (TimeoutError, errors.ClientError, DLedgerError, OSError) as err:
                history.add(proc=proc, type="info", f="send", value=value, error=_name(err))
            else:
                history.add(proc=proc, type="ok", f="send", value=value, queue=r.queue.queue_id,
                            offset=r.queue_offset, node=r.node, dup=r.duplicate)
            try:
                await asyncio.wait_for(stop.wait(), pause_s)  # pacing the offered load
            except TimeoutError:
                pass


async def consumer(history: History, namesrv: str, name: str, queue_id: int, group: str,
                   stop: asyncio.Event, reread_every_s: float | None, rng: random.Random) -> None:
    mq = MessageQueue(TOPIC, group, queue_id)
    session, offset = 0, 0
    next_reread = time.monotonic() + (reread_every_s or 0) * rng.uniform(0.5, 1.5)
    next_commit = time.monotonic() + COMMIT_EVERY_S * rng.uniform(0.5, 1.5)
    ops = itertools.count()
    async with PullConsumer(namesrv, f"chaos-{name}", timeout_s=3.0) as pc:
        while not stop.is_set():
            if reread_every_s is None and time.monotonic() >= next_commit:
                await _commit_and_read_back(history, pc, name, mq, offset, ops)
                next_commit = time.monotonic() + COMMIT_EVERY_S
            if reread_every_s is not None and time.monotonic() >= next_reread:
                session, offset = session + 1, 0  # re-read from the start: a new session
                next_reread = time.monotonic() + reread_every_s * rng.uniform(0.5, 1.5)
            try:
                res = await asyncio.wait_for(pc.pull(mq, offset, max_messages=64, suspend_ms=500),
                                             5.0)
            except (TimeoutError, errors.ClientError, DLedgerError, OSError) as err:
                history.add(proc=name, type="fail", f="poll", queue=queue_id, **{"from": offset},
                            error=_name(err), session=session)
                await _pause(stop, 0.2)  # back off before the next poll
                continue
            values = [[m.queue_offset, value_of(m.body)] for m in res.messages]
            history.add(proc=name, type="ok", f="poll", queue=queue_id, **{"from": offset},
                        values=values, node=None, session=session, status=res.status)
            if res.status == bp.FOUND:
                offset = res.next_offset
            elif res.status == bp.OFFSET_OUT_OF_RANGE:
                await _pause(stop, 0.2)  # a lagging replica: ask again, never skip ahead


async def _commit_and_read_back(history: History, pc: PullConsumer, name: str, mq: MessageQueue,
                                offset: int, ops: Iterator[int]) -> None:
    """Commit the consumer's offset (it only grows), then read it back through the leader:
    the register-like sub-history that ``chaos.live.checkers.registers`` checks for stale reads."""
    key = {"group": pc.group, "queue": mq.queue_id}
    op = next(ops)
    history.add(proc=name, type="invoke", f="offset-commit", op=op, value=offset, **key)
    try:
        await asyncio.wait_for(pc.commit(mq, offset), 5.0)
    except (errors.RetriableError, errors.NonRetriableError) as err:
        history.add(proc=name, type="fail", f="offset-commit", op=op, value=offset,
                    error=_name(err), **key)
    except (TimeoutError, errors.ClientError, DLedgerError, OSError) as err:
        history.add(proc=name, type="info", f="offset-commit", op=op, value=offset,
                    error=_name(err), **key)
    else:
        history.add(proc=name, type="ok", f="offset-commit", op=op, value=offset, **key)
    op = next(ops)
    history.add(proc=name, type="invoke", f="offset-read", op=op, value=None, **key)
    try:
        value = await asyncio.wait_for(pc.committed(mq), 5.0)
    except (TimeoutError, errors.ClientError, DLedgerError, OSError) as err:
        history.add(proc=name, type="fail", f="offset-read", op=op, value=None,
                    error=_name(err), **key)
    else:
        history.add(proc=name, type="ok", f="offset-read", op=op, value=value, **key)


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass


def _name(err: BaseException) -> str:
    text = str(err)
    return f"{type(err).__name__}: {text[:160]}" if text else type(err).__name__


async def read_queue(client: LogClient, node: str | None, queue_id: int,
                     deadline_s: float = 30.0,
                     ids: dict[tuple[int, int], str] | None = None) -> list[tuple[int, str]]:
    """Every message of one queue from offset 0, from ``node`` alone (None: the leader);
    ``ids``, if given, gets each message's id by (queue, offset)."""
    out: list[tuple[int, str]] = []
    offset = 0
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        args = (bp.PULL, TOPIC, queue_id, offset, 1024, 4 << 20, 0, ["*"])
        if node is None:
            _, res = await client.call_leader(*args, timeout_s=5.0)
        else:
            res = await client.call(node, *args, timeout_s=5.0)
        status, nxt, _lo, _hi, rows = res
        if status != bp.FOUND:
            return out
        out.extend((int(r[0]), value_of(r[1])) for r in rows)
        if ids is not None:
            ids.update(((queue_id, int(r[0])), bp.message_id(r[4], r[5])) for r in rows)
        offset = int(nxt)
    raise TimeoutError(f"reading queue {queue_id} from {node or 'the leader'} took over {deadline_s} s")


async def drain(client: LogClient, nodes: list[str],
                ids: dict[tuple[int, int], str] | None = None,
                ) -> tuple[dict[str, dict[int, list[tuple[int, str]]]],
                           dict[int, list[tuple[int, str]]], list[str]]:
    """(per-replica dumps, the leader's, problems) for every queue of the topic; ``ids`` gets
    the message id of each message the leader holds, by (queue, offset)."""
    replicas: dict[str, dict[int, list[tuple[int, str]]]] = {}
    problems: list[str] = []
    for n in nodes:
        replicas[n] = {}
        for q in range(QUEUES):
            try:
                replicas[n][q] = await read_queue(client, n, q)
            except (DLedgerError, TimeoutError, OSError, ValueError, IndexError) as err:
                problems.append(f"replica {n} queue {q} could not be read: {_name(err)}")
    leader: dict[int, list[tuple[int, str]]] = {}
    for q in range(QUEUES):
        try:
            leader[q] = await read_queue(client, None, q, ids=ids)
        except (DLedgerError, TimeoutError, OSError, ValueError, IndexError) as err:
            problems.append(f"queue {q} could not be read through the leader: {_name(err)}")
    return replicas, leader, problems
