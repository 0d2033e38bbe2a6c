"""How the producer delivers messages that travel together: a queue chosen per message (round
robin over the writable queues of its topic's groups, away from groups tried or isolated), one
request per group (SEND_RUNS, one run per queue; a batch is one SEND), and, for what failed, the
retry rule of ``client.producer.producer`` applied to the messages that failed together.

Messages are held in parallel lists (``Sends``) and addressed by index, so that a message costs
nothing beyond its wire form and its caller's future however many attempts it takes.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from client import errors
from client.cluster.routes import GroupRoute, Routes, TopicRoute, client_error
from client.types import MessageQueue, SendResult
from protocol import broker_kinds as bp
from protocol.envelope import RemoteError
from protocol.errors import DLedgerError

ISOLATE_S = 30.0  # a group that failed is skipped this long, unless no other group is left
ATTEMPT_S = 1.0  # one attempt's share of the send deadline: a silent leader is left for the others
POLL_S = 0.1  # between asks for a route that is not there yet, or a stale one
SEND_OK = "SEND_OK"

T = TypeVar("T")
Runs = dict[tuple[str, int], list[int]]  # (topic, queue id) -> indexes of its messages


class Sends:
    """Messages that travel together: per message its topic, its wire form (unique key kept
    across attempts) and its caller's future; or, for a batch, one message list and one future
    for all of them (``batch``); or nobody waiting (oneway: ``futures`` None)."""

    __slots__ = ("topics", "raws", "futures", "batch")

    def __init__(self, topics: list[str], raws: list[Any],
                 futures: list[asyncio.Future[SendResult]] | None = None,
                 batch: asyncio.Future[list[SendResult]] | None = None) -> None:
        self.topics = topics
        self.raws = raws  # per message [body, tags, keys, unique key, props, born]; a batch: 1 list
        self.futures = futures
        self.batch = batch

    def settle(self, indexes: list[int], results: list[SendResult]) -> None:
        if self.batch is not None:
            if not self.batch.done():
                self.batch.set_result(results)
        elif self.futures is not None:
            for i, result in zip(indexes, results):
                if not self.futures[i].done():
                    self.futures[i].set_result(result)

    def fail(self, indexes: list[int], err: Exception) -> None:
        if self.batch is not None:
            if not self.batch.done():
                self.batch.set_exception(err)
        elif self.futures is not None:
            for i in indexes:
                if not self.futures[i].done():
                    self.futures[i].set_exception(fresh(err))

    def fail_all(self, err: Exception) -> None:
        self.fail(list(range(len(self.topics))), err)

    def cancel(self) -> None:
        for fut in ([self.batch] if self.batch is not None else self.futures or []):
            fut.cancel()


@dataclass(frozen=True)
class Attempt:
    """What some messages went through together: the deadline, the attempts left (this one
    included), the groups tried, whether an earlier attempt's outcome is unknown."""

    deadline: float
    left: int
    tried: frozenset[str] = frozenset()
    unknown: bool = False
    last: errors.ClientError | None = None
    refresh: bool = False  # ask the NameServers for fresh routes first

    def final(self, what: str, err: errors.ClientError | None = None) -> errors.ClientError:
        """The error to report: an earlier attempt that may have stored the messages makes
        any later failure an unknown outcome."""
        last = err or self.last or errors.UnavailableError(f"no group took the send to {what}")
        if self.unknown and not isinstance(last, errors.SendTimeoutError):
            timeout = errors.SendTimeoutError(f"send to {what}: an earlier attempt's outcome is "
                                              f"unknown; the last one failed: {last}")
            timeout.__cause__ = last
            return timeout
        return last


def _random_first_index() -> int:
    return random.randrange(1 << 16)


first_index = _random_first_index  # where a producer's round robin over a topic's queues starts


class Delivery:
    """``new_topic_queues``: the queue count each request asks for a topic it creates (the
    producer's ``default_topic_queue_nums``; None: not asked, the broker's default)."""

    def __init__(self, routes: Routes, new_topic_queues: int | None = None) -> None:
        self._routes = routes
        self._asked = [] if new_topic_queues is None else [new_topic_queues]  # after a run's fields
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._isolated: dict[str, float] = {}  # group -> until (monotonic)
        # topic -> (the groups of its route last seen, their writable (group, queue id) pairs)
        self._writable: dict[str, tuple[Sequence[GroupRoute], list[tuple[GroupRoute, int]]]] = {}

    async def deliver(self, sends: Sends, idx: list[int], att: Attempt, retry: bool) -> None:
        """Deliver messages ``idx`` of ``sends``; every one of them is settled on return."""
        topics = sorted({sends.topics[i] for i in idx})
        routes: dict[str, TopicRoute] = {}
        while len(routes) < len(topics):
            try:
                for t in topics:
                    routes[t] = await self._routes.route(t, refresh=att.refresh)
            except errors.UnavailableError as err:  # no group registered yet: wait a little
                routes.clear()
                att = replace(att, last=err)
                if time.monotonic() + POLL_S >= att.deadline:
                    sends.fail(idx, att.final(_names(topics)))
                    return
                await asyncio.sleep(POLL_S)  # polling the NameServer until a group shows up
        plan: dict[str, tuple[GroupRoute, Runs]] = {}
        for topic, ix in _by_topic(sends, idx).items():
            try:
                self._choose(topic, routes[topic].groups, att.tried, ix, plan, sends.batch is not None)
            except errors.NoPermissionError as err:
                sends.fail(ix, att.final(repr(topic), err))
        if len(plan) == 1:  # (the common case: awaited here, not in a task of its own, which
            # would cost the request a loop turn before it leaves)
            (group, runs), = plan.values()
            await self._to_group(sends, group, runs, routes, att, retry)
            return
        await asyncio.gather(*(self._to_group(sends, group, runs, routes, att, retry)
                               for group, runs in plan.values()))

    def _choose(self, topic: str, groups: Sequence[GroupRoute], tried: frozenset[str],
                idx: list[int], plan: dict[str, tuple[GroupRoute, Runs]], batch: bool) -> None:
        """A (group, queue) per message of ``topic`` (one for a whole batch), into ``plan``."""
        held = self._writable.get(topic)
        if held is None or held[0] is not groups:  # (a route is replaced, never changed)
            held = self._writable[topic] = (groups, [(g, q) for g in groups if g.perm & 2
                                                     for q in range(g.write_queues)])
        queues = held[1]
        if not queues:
            raise errors.NoPermissionError(f"no group accepts writes to {topic!r}")
        if self._isolated:  # (an isolation that ended is dropped: the common case comes back)
            now = time.monotonic()
            self._isolated = {g: until for g, until in self._isolated.items() if until > now}
        if tried or self._isolated:  # (every isolation left is still in force)
            fresh_queues = [x for x in queues if x[0].group not in tried
                            and x[0].group not in self._isolated]
            pool = fresh_queues or [x for x in queues if x[0].group not in tried] or queues
        else:  # the common case: every group fresh
            pool = queues
        counter = self._round_robin.get(topic)
        if counter is None:  # from a random queue, as RocketMQ's producer: many short-lived
            # producers (one `dledger send` each) spread over the queues, not all on queue 0
            counter = self._round_robin[topic] = itertools.count(first_index())
        for i in idx[:1] if batch else idx:
            group, queue_id = pool[next(counter) % len(pool)]
            entry = plan.get(group.group)
            if entry is None:
                entry = plan[group.group] = (group, {})
            entry[1].setdefault((topic, queue_id), []).append(i)

    async def _to_group(self, sends: Sends, group: GroupRoute, runs: Runs,
                        routes: dict[str, TopicRoute], att: Attempt, retry: bool) -> None:
        """One attempt on one group; then the next for whatever failed."""
        def others(topics: set[str]) -> bool:  # another group to try for these topics
            return any(g.group != group.group and g.group not in att.tried
                       for t in topics for g in routes[t].groups)

        topics = {t for t, _ in runs}
        share_s = (att.deadline - time.monotonic()) / att.left if others(topics) else None
        if sends.batch is not None:
            ((topic, queue_id), ix), = runs.items()
            kind, args = bp.SEND, [topic, queue_id, sends.raws[0], *self._asked]
        else:
            kind, args = bp.SEND_RUNS, [[[t, q, [sends.raws[i] for i in ix], *self._asked]
                                         for (t, q), ix in runs.items()]]
        all_idx = [i for ix in runs.values() for i in ix]
        try:
            node, res, unknown = await self._call(group, kind, args, att.deadline, retry, share_s)
        except (errors.ClientError, DLedgerError) as raised:
            err = raised if isinstance(raised, errors.ClientError) else client_error(raised)
            return await self._next(sends, all_idx, group, err, others(topics), att, retry, topics)
        answers = [res] if kind == bp.SEND else res
        failed: dict[str, tuple[list[int], errors.ClientError, set[str]]] = {}
        for ((topic, _), ix), answer in zip(runs.items(), answers):
            if answer[0] == SEND_OK:
                raws = sends.raws[0] if sends.batch is not None else [sends.raws[i] for i in ix]
                sends.settle(ix, _results(topic, group.group, answer, raws, node))
                continue
            err = client_error(RemoteError(answer[0], answer[1]))
            if unknown:  # an earlier try may have stored them: only this group could tell
                sends.fail(ix, errors.SendTimeoutError(f"send to {topic!r}: outcome unknown, "
                                                       f"then {err}"))
                continue
            held = failed.setdefault(answer[0], ([], err, set()))
            held[0].extend(ix)
            held[2].add(topic)
        await asyncio.gather(*(self._next(sends, ix, group, err, others(ts), att, retry, ts)
                               for ix, err, ts in failed.values()))

    async def _next(self, sends: Sends, idx: list[int], group: GroupRoute,
                    err: errors.ClientError, others: bool, att: Attempt, retry: bool,
                    topics: set[str]) -> None:
        """After ``err`` on ``group``: another attempt for ``idx`` (elsewhere, or the same group
        with a fresh route), or their final error."""
        what = _names(sorted(topics))
        now = time.monotonic()
        if isinstance(err, errors.NoPermissionError):
            # the route said writable, the group says read-only for the topic: nothing was
            # stored; other groups may take it (the group stays fine for other topics)
            if not others:
                sends.fail(idx, att.final(what, err))
                return
            for t in topics:
                self._routes.invalidate(t)
            nxt = replace(att, left=att.left - 1, tried=att.tried | {group.group}, last=err,
                          refresh=True)
        elif isinstance(err, (errors.RetriableError, errors.SendTimeoutError)):
            unknown = att.unknown or isinstance(err, errors.SendTimeoutError)
            for t in topics:
                self._routes.invalidate(t)
            if isinstance(err, errors.StaleRouteError) or (
                    isinstance(err, errors.UnavailableError) and not others):
                # the group is fine but our view of it is stale (or it is the only group):
                # refresh the route and try it again, without isolating it or counting the try
                nxt = replace(att, unknown=unknown, last=err, refresh=True)
                if now + POLL_S >= att.deadline:
                    sends.fail(idx, nxt.final(what))
                    return
                await asyncio.sleep(POLL_S)  # polling the NameServer for the group's new view
                return await self.deliver(sends, idx, nxt, retry)
            self._isolated[group.group] = now + ISOLATE_S
            nxt = replace(att, left=att.left - 1, tried=att.tried | {group.group}, unknown=unknown,
                          last=err, refresh=True)
            if isinstance(err, errors.SendTimeoutError) and not others:
                sends.fail(idx, err)
                return
        else:
            sends.fail(idx, att.final(what, err))
            return
        if nxt.left <= 0 or now >= nxt.deadline:
            sends.fail(idx, nxt.final(what))
            return
        await self.deliver(sends, idx, nxt, retry)

    async def _call(self, group: GroupRoute, kind: int, args: list[Any], deadline: float,
                    retry: bool, share_s: float | None) -> tuple[str, Any, bool]:
        """One request to a group's leader, asked again while its outcome is unknown (the group
        dedups unique keys) until its share of the deadline ends. Returns the answering node,
        the answer and whether an earlier try's outcome was unknown."""
        client = self._routes.group_client(group)
        if share_s is not None:
            deadline = min(deadline, time.monotonic() + share_s)
        unknown = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise errors.SendTimeoutError(f"send to group {group.group!r} not known to be "
                                              "committed in time")
            try:
                node, res = await client.call_leader(kind, *args, timeout_s=min(remaining, ATTEMPT_S)
                                                     if retry else remaining)
            except DLedgerError as err:
                mapped = client_error(err)
                if isinstance(mapped, errors.SendTimeoutError) and retry:
                    unknown = True
                    continue  # outcome unknown: the same group dedups the unique keys
                if unknown and isinstance(mapped, errors.RetriableError) \
                        and not isinstance(mapped, errors.StaleRouteError):
                    # an earlier attempt may be stored: only this group can tell (it dedups the
                    # key), so keep asking it, through its election, until the deadline
                    await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                    continue
                if unknown and not isinstance(mapped, errors.SendTimeoutError):
                    raise errors.SendTimeoutError(
                        f"send to group {group.group!r}: outcome unknown, then {mapped}") from err
                raise mapped from err
            return node, res, unknown


    async def to_queue(self, raws: list[Any], mq: MessageQueue, deadline: float) -> SendResult:
        """One message to one chosen queue (an ordered send): retried on that queue only, an
        unknown outcome asked again of its group (which dedups the unique key), never moved to
        another queue, which would break the order of its key."""
        while True:
            route = await self._routes.route(mq.topic)
            group = next((g for g in route.groups if g.group == mq.group), None)
            if group is None:
                raise errors.TopicNotFoundError(f"group {mq.group} does not serve {mq.topic!r}")
            try:
                run = [mq.topic, mq.queue_id, raws, *self._asked]
                node, res, _ = await self._call(group, bp.SEND_RUNS, [[run]], deadline, True, None)
            except (errors.ClientError, DLedgerError) as raised:
                err = raised if isinstance(raised, errors.ClientError) else client_error(raised)
                if not isinstance(err, errors.RetriableError) \
                        or time.monotonic() + POLL_S >= deadline:
                    raise err from raised
                self._routes.invalidate(mq.topic)
                await asyncio.sleep(POLL_S)  # polling the NameServer for the group's new view
                continue
            answer = res[0]
            if answer[0] != SEND_OK:
                raise client_error(RemoteError(answer[0], answer[1]))
            return _results(mq.topic, group.group, answer, raws, node)[0]


def _by_topic(sends: Sends, idx: list[int]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i in idx:
        ix = out.get(sends.topics[i])
        if ix is None:
            ix = out[sends.topics[i]] = []
        ix.append(i)
    return out


def _names(topics: Sequence[str]) -> str:
    return ", ".join(repr(t) for t in topics)


def _results(topic: str, group: str, res: list[Any], raws: list[Any],
             node: str = "") -> list[SendResult]:
    status, _, offsets, offset_ids, dups, queue_ids = res
    queues: dict[int, MessageQueue] = {}  # one object per queue, not per message
    out = []
    for k in range(len(raws)):
        mq = queues.get(queue_ids[k])
        if mq is None:
            mq = queues[queue_ids[k]] = MessageQueue(topic, group, queue_ids[k])
        out.append(SendResult(status, raws[k][3], offset_ids[k], mq, offsets[k], dups[k], node))
    return out


def fresh(err: Exception) -> Exception:
    """A copy of ``err`` for one more caller (one instance raised in many tasks tangles their
    tracebacks); ``err`` itself when it cannot be copied."""
    try:
        twin = copy.copy(err)
    except Exception:  # an exception type that does not copy: share it
        return err
    if str(twin) != str(err) or vars(twin) != vars(err):
        return err  # its constructor takes other arguments than its args: share it
    twin.__cause__ = err.__cause__
    return twin


def chunks(items: Sequence[T], max_bytes: int, max_items: int, size: Callable[[T], int]) -> list[list[T]]:
    """Consecutive runs of ``items`` of at most ``max_bytes`` (by ``size``) and ``max_items``."""
    out: list[list[T]] = []
    total = 0
    for x in items:
        n = size(x)
        if not out or total + n > max_bytes or len(out[-1]) >= max_items:
            out.append([])
            total = 0
        out[-1].append(x)
        total += n
    return out
