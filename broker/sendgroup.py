"""Group commit of sends on the leader: send requests to one queue that arrive in the same turn of
the event loop are stored as one log entry (one Raft entry, one share of an fsync, one apply on
every replica), and each request is answered with its own slice of that entry's result.

A request's messages stay contiguous and in their order inside the entry, so a batch is still all
or nothing in one queue, and per-queue order is arrival order. A group is bounded
(``max_bytes`` of bodies, ``max_messages``): a request that would overflow the open group closes
it and starts the next, and a request larger than the bound travels alone. The bounds are well
below a batch request's 4 MiB on purpose: moderate entries keep the replication pipeline full (a
follower appends one while the leader builds the next); one huge entry per loop turn made the
processes take turns (measured: 256 messages or 256 KiB gave about a tenth more throughput on the
batch path than 1,024 messages or 4 MiB). Retried sends stay safe: dedup is per message (unique
key) at apply.

The module owns only the grouping and the slicing; the server supplies how to propose an entry
and how to read an applied entry's answer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable

from dledger.errors import DLedgerError
from broker.errors import BrokerError

# reply(answer, None) or reply(None, error): answers one client request
Reply = Callable[[list[Any] | None, Exception | None], None]
# propose(topic, queue_id, messages) -> a future that ends when the entry is committed
Propose = Callable[[str, int, list[list[Any]]], "asyncio.Future[Any]"]
# answer(that future's result) -> the applied entry's answer: status, queue_id, then per message
# lists of offsets, message ids, duplicate flags and queue ids (raises a named error if refused)
Answer = Callable[[Any], list[Any]]

MAX_GROUP_MESSAGES = 256
MAX_GROUP_BYTES = 256 * 1024


@dataclass
class _Group:
    messages: list[list[Any]] = field(default_factory=list)
    replies: list[tuple[int, int, Reply]] = field(default_factory=list)  # (first slot, count, reply)
    size_bytes: int = 0


class SendGroups:
    """Collects sends per (topic, queue) until the loop turn ends, then proposes each group."""

    def __init__(self, propose: Propose, answer: Answer, max_bytes: int = MAX_GROUP_BYTES,
                 max_messages: int = MAX_GROUP_MESSAGES) -> None:
        self._propose = propose
        self._answer = answer
        self.max_bytes = max_bytes
        self.max_messages = max_messages
        self._open: dict[tuple[str, int], _Group] = {}
        self._flush_scheduled = False
        self.entries_proposed = 0
        self.requests_grouped = 0

    def add(self, topic: str, queue_id: int, messages: list[list[Any]], size_bytes: int,
            reply: Reply) -> None:
        """Queue one validated request (its messages in entry form) for the next group commit."""
        key = (topic, queue_id)
        group = self._open.get(key)
        if group is not None and (group.size_bytes + size_bytes > self.max_bytes
                                  or len(group.messages) + len(messages) > self.max_messages):
            self._propose_group(key, self._open.pop(key))
            group = None
        if group is None:
            group = self._open[key] = _Group()
        group.replies.append((len(group.messages), len(messages), reply))
        group.messages.extend(messages)
        group.size_bytes += size_bytes
        self.requests_grouped += 1
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Propose every open group (called at the end of the loop turn that opened them)."""
        self._flush_scheduled = False
        groups, self._open = self._open, {}
        for key, group in groups.items():
            self._propose_group(key, group)

    def _propose_group(self, key: tuple[str, int], group: _Group) -> None:
        try:
            fut = self._propose(key[0], key[1], group.messages)
        except Exception as err:  # noqa: BLE001 - named or not, every request must be answered
            for _, _, reply in group.replies:
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
                answer = self._answer(fut.result())
            except (DLedgerError, BrokerError) as failure:
                err = failure
        if err is not None:
            for _, _, reply in group.replies:
                reply(None, err)
            return
        status, queue_id, offsets, ids, dups, qids = answer
        for first, count, reply in group.replies:
            end = first + count
            reply([status, queue_id, offsets[first:end], ids[first:end], dups[first:end],
                   qids[first:end]], None)
