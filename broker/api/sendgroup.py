"""Group commit of sends on the leader: the send requests that arrive in the same turn of the
event loop are stored as one log entry (one Raft entry, one share of an fsync, one apply on every
replica), whatever their topics and queues, and each request is answered with its own slices of
that entry's result.

A request brings one or more runs (messages to one queue of one topic). The entry holds one run
per (topic, queue) of the group, in the order they first arrived; a request's messages stay
contiguous and in their order inside each of its runs, so a batch is still all or nothing in one
queue, and per-queue order is arrival order. A group is bounded (``max_bytes`` of message sizes,
``max_messages``) over all its runs: a request that would overflow the open group closes it and
starts the next, and a request larger than the bound travels alone. The bounds are well below a
batch request's 4 MiB on purpose: moderate entries keep the replication pipeline full (a
follower appends one while the leader builds the next); one huge entry per loop turn made the
processes take turns (measured: 256 messages or 256 KiB gave about a tenth more throughput on the
batch path than 1,024 messages or 4 MiB). Retried sends stay safe: dedup is per message (unique
key) at apply.

The module owns only the grouping and the slicing; the server supplies how to propose an entry
and how to read an applied entry's answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from protocol.broker_errors import BrokerError
from protocol.errors import DLedgerError

RunKey = tuple[str, int]  # (topic, queue id)
# One run of a request: topic, queue id, its messages (entry form), their size in bytes
Run = tuple[str, int, list[list[Any]], int]
# What a reply keeps of a run for the metrics: topic, message count, size in bytes (not the
# messages: those are dropped once their entry is proposed)
RunTally = tuple[str, int, int]
# reply(answers, None) or reply(None, error): answers one client request, one answer per run
Reply = Callable[[list[list[Any]] | None, BaseException | None], None]
# propose([((topic, queue_id), messages), ...], {topic: queue count asked if the entry creates
# it}) -> a future that ends when the entry is committed
Propose = Callable[[list[tuple[RunKey, list[list[Any]]]], dict[str, int]], "asyncio.Future[Any]"]
# answer(that future's result) -> one answer per run of the entry: [status, queue_id, then per
# message lists of offsets, message ids, duplicate flags and queue ids], or [code, detail] for a
# refused run (raises a named error if the entry as a whole failed)
Answer = Callable[[Any], list[list[Any]]]

MAX_GROUP_MESSAGES = 256
MAX_GROUP_BYTES = 256 * 1024
SEND_OK = "SEND_OK"


def tally(runs: list[Run]) -> list[RunTally]:
    """What a reply keeps of its request's runs."""
    return [(topic, len(messages), size) for topic, _, messages, size in runs]


class _Group:
    __slots__ = ("runs", "keys", "queues", "replies", "size_bytes", "count")

    def __init__(self) -> None:
        self.runs: dict[RunKey, list[list[Any]]] = {}  # in order of first arrival
        self.keys: list[RunKey] = []  # the runs' keys, kept once the runs are proposed
        self.queues: dict[str, int] = {}  # topic -> queue count if created (the first asked)
        # per request: its reply and, per run of it, (run key, first message, count)
        self.replies: list[tuple[Reply, list[tuple[RunKey, int, int]]]] = []
        self.size_bytes = 0
        self.count = 0


class SendGroups:
    """Collects the sends of a loop turn, then proposes them as one entry (or a few, by bounds)."""

    def __init__(self, propose: Propose, answer: Answer, max_bytes: int = MAX_GROUP_BYTES,
                 max_messages: int = MAX_GROUP_MESSAGES) -> None:
        self._propose = propose
        self._answer = answer
        self.max_bytes = max_bytes
        self.max_messages = max_messages
        self._open: _Group | None = None
        self._flush_scheduled = False
        self.entries_proposed = 0
        self.requests_grouped = 0

    def add(self, runs: list[Run], reply: Reply, queues: dict[str, int] | None = None) -> None:
        """Queue one validated request (its runs' messages in entry form) for the next group
        commit; ``reply`` gets one answer per run, in the order of ``runs``. ``queues``: the
        queue count the request asks for a topic it creates (the group keeps the first asked)."""
        size = 0
        count = 0
        for run in runs:
            size += run[3]
            count += len(run[2])
        group = self._open
        if group is not None and (group.size_bytes + size > self.max_bytes
                                  or group.count + count > self.max_messages):
            self._propose_group(group)
            group = None
        if group is None:
            group = self._open = _Group()
        slices = []
        for topic, queue_id, messages, _ in runs:
            key = (topic, queue_id)
            held = group.runs.get(key)
            if held is None:
                group.runs[key] = held = []
            slices.append((key, len(held), len(messages)))
            held.extend(messages)
        group.replies.append((reply, slices))
        for topic, n in (queues or {}).items():
            group.queues.setdefault(topic, n)
        group.size_bytes += size
        group.count += count
        self.requests_grouped += 1
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Propose the open group (called at the end of the loop turn that opened it)."""
        self._flush_scheduled = False
        group, self._open = self._open, None
        if group is not None:
            self._propose_group(group)

    def _propose_group(self, group: _Group) -> None:
        # The messages go into the entry: until the answer the group keeps only the runs' keys,
        # so a leader holds no decoded message while its entry is replicated and synced (held
        # to the answer, the requests in flight had left a few MiB of small objects' memory
        # resident after every burst).
        runs, group.runs = group.runs, {}
        group.keys = list(runs)
        try:
            fut = self._propose(list(runs.items()), group.queues)
        except Exception as err:  # named or not, every request must be answered
            for reply, _ in group.replies:
                reply(None, err)
            return
        self.entries_proposed += 1
        fut.add_done_callback(lambda f: self._answered(f, group))

    def _answered(self, fut: asyncio.Future[Any], group: _Group) -> None:
        if fut.cancelled():
            return
        err = fut.exception()
        if err is None:
            try:
                answers = self._answer(fut.result())
            except (DLedgerError, BrokerError) as failure:
                err = failure
            else:
                if len(answers) != len(group.keys):
                    if len(answers) != 1 or answers[0][0] == SEND_OK:
                        err = BrokerError(f"{len(answers)} answers to {len(group.keys)} runs")
                    answers = answers * len(group.keys)  # the entry as a whole was refused
        if err is not None:
            for reply, _ in group.replies:
                reply(None, err)
            return
        by_run = dict(zip(group.keys, answers))
        for reply, slices in group.replies:
            reply([_slice(by_run[key], first, count) for key, first, count in slices], None)


def _slice(answer: list[Any], first: int, count: int) -> list[Any]:
    """One request's part of a run's answer (a refusal is the same for every request)."""
    if answer[0] != SEND_OK:
        return answer
    status, queue_id, offsets, ids, dups, qids = answer
    end = first + count
    return [status, queue_id, offsets[first:end], ids[first:end], dups[first:end], qids[first:end]]
