"""The leader's send path: SEND and SEND_RUNS requests checked (``sendwire``: every field, the
sizes) and against the state machine's topics, grouped with the other sends of the loop turn
(``sendgroup``), proposed as one entry, and answered per run once it is applied.

A send may ask for the queue count of its topic should the send create it (a SEND's fourth
argument, a run's fourth field: the producer's ``default_topic_queue_nums``, RocketMQ's
defaultTopicQueueNums): 1..MAX_QUEUES, else refused as BAD_REQUEST; capped at the broker's own
``default_queues``, as RocketMQ caps it; without it the broker's default.

The hot path of the broker: a request from the connection is handled without a task (``handle``)
and the node's future always ends (committed, leadership lost, stopped); the client enforces
its own deadline. Owns nothing replicated: it reads the broker's state machine, node and
configuration.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

from broker.api.sendgroup import Run, RunKey, RunTally, SendGroups, tally
from broker.core.applied import ApplyResult
from broker.core.entries import encode_runs, encode_send
from broker.core.sendwire import SEND_OK, check_entry_size, run_answers, wire_messages
from broker.features.delay.model import DelayError, route_run
from broker.features.host import BrokerHost
from dledger.node.config import Committed
from protocol.broker_errors import BadDelayError, BadEntryError, BadRequestError, BrokerError
from protocol.broker_kinds import SEND, SendRefusedError
from protocol.envelope import Request, encode_error, encode_result
from protocol.errors import DLedgerError
from protocol.topics import MAX_QUEUES, SEND_RESERVED_TOPICS, TRACE_TOPIC, validate_topic_name


class Connection(Protocol):
    def send_payload(self, payload: bytes) -> None: ...


class SendMetrics(Protocol):
    def sent(self, runs: Sequence[RunTally], answers: Sequence[Any], started_s: float) -> None: ...

    def proposed(self, fut: asyncio.Future[Committed]) -> None: ...


class SendHost(BrokerHost, Protocol):
    """What the send path uses of its broker (``broker.api.broker.Broker``) beyond any
    feature's: the apply results by index and the send metrics."""

    @property
    def results(self) -> OrderedDict[int, ApplyResult]: ...

    @property
    def metrics(self) -> SendMetrics: ...


class SendPath:
    def __init__(self, host: SendHost) -> None:
        self.host = host
        self.groups = SendGroups(self._propose, self._answer)
        self._key_only = "dedup_key_only" in host.config.canaries  # (sendwire.SCOPE_CANARIES)

    def handle(self, req: Request, conn: Connection) -> bool:
        """A SEND or SEND_RUNS request from ``conn``, answered on it when its entry is applied
        (or at once with a named error). Returns True: the request is handled."""
        rid = req.request_id
        started_s = time.perf_counter()
        try:
            self.host.require_leader()
            if req.kind == SEND:
                if len(req.args) not in (3, 4):
                    raise BadEntryError("SEND takes a topic, a queue id, messages and "
                                        "optionally the queue count of a topic it creates")
                topic, queue_id, raw, *asked = req.args
                created: dict[str, int] = {}
                runs, answers = [self._run(topic, queue_id, raw, True, asked, created)], None
            else:
                runs, answers, created = self._runs(req.args)
        except (DLedgerError, BrokerError) as err:
            conn.send_payload(encode_error(rid, err))
            return True
        tallies = tally(runs)

        def reply(got: list[list[Any]] | None, err: BaseException | None) -> None:
            try:
                if got is None:
                    raise err or BrokerError("send failed")
                self.host.metrics.sent(tallies, got, started_s)
                conn.send_payload(encode_result(rid, _merge(answers, got) if answers is not None
                                                else _sole_answer(got[0])))
            except (DLedgerError, BrokerError) as failure:
                conn.send_payload(encode_error(rid, failure))
            except Exception as failure:  # the client must get an answer
                conn.send_payload(encode_error(rid, BrokerError(f"send failed: {failure!r}")))

        if runs:
            self.groups.add(runs, reply, created)
        else:  # every run refused before proposing
            conn.send_payload(encode_result(rid, answers))
        return True

    async def send_runs(self, args: list[Any]) -> list[Any]:
        """SEND_RUNS through the group commit, awaited: one answer per run."""
        self.host.require_leader()
        runs, answers, created = self._runs(args)
        if not runs:
            return answers
        fut: asyncio.Future[list[list[Any]]] = asyncio.get_running_loop().create_future()
        started_s = time.perf_counter()
        tallies = tally(runs)

        def reply(got: list[list[Any]] | None, err: BaseException | None) -> None:
            if fut.done():
                return
            if got is not None:
                self.host.metrics.sent(tallies, got, started_s)
                fut.set_result(got)
            else:
                fut.set_exception(err or BrokerError("send failed"))

        self.groups.add(runs, reply, created)
        return _merge(answers, await fut)

    async def send(self, topic: str, queue_id: int, raw: list[Any],
                   asked: Sequence[Any] = ()) -> list[Any]:
        """SEND through the group commit, awaited (``asked``: empty, or the queue count of a
        topic it creates)."""
        self.host.require_leader()
        created: dict[str, int] = {}
        run = self._run(topic, queue_id, raw, True, list(asked), created)
        return await self._await_run(run, created)

    async def submit(self, topic: str, queue_id: int, raw: list[Any]) -> list[Any]:
        """Messages the broker stores on its own account (retries, dead letters) to a system
        topic that exists: checked as any send's, delayed as their properties say."""
        self.host.require_leader()
        config = self.host.config
        messages, size, _ = wire_messages(topic, raw, config.max_message_bytes, batch=False)
        try:
            topic, queue_id, messages = route_run(
                topic, queue_id, messages, int(time.time() * 1000), config.delay_levels_ms,
                config.max_delay_ms, batch=False)
        except DelayError as err:
            raise BadDelayError(str(err)) from err
        return await self._await_run((topic, queue_id, messages, size))

    async def _await_run(self, run: Run, created: dict[str, int] | None = None) -> list[Any]:
        fut: asyncio.Future[list[list[Any]]] = asyncio.get_running_loop().create_future()
        started_s = time.perf_counter()
        tallies = tally([run])

        def reply(answers: list[list[Any]] | None, err: BaseException | None) -> None:
            if fut.done():
                return
            if answers is not None:
                self.host.metrics.sent(tallies, answers, started_s)
                fut.set_result(answers)
            else:
                fut.set_exception(err or BrokerError("send failed"))

        self.groups.add([run], reply, created)
        return _sole_answer((await fut)[0])

    def _runs(self, args: list[Any]) -> tuple[list[Run], list[Any], dict[str, int]]:
        """SEND_RUNS' runs checked one by one: the valid ones, the answers so far (a refused
        run's ``[code, detail]``, None where the entry will answer) and the queue counts asked
        for the topics they may create."""
        if len(args) != 1 or type(args[0]) is not list or not args[0]:
            raise BadEntryError("SEND_RUNS takes one non-empty list of [topic, queue id, messages]")
        runs: list[Run] = []
        answers: list[Any] = []
        created: dict[str, int] = {}
        for raw_run in args[0]:
            try:
                if type(raw_run) is not list or len(raw_run) not in (3, 4):
                    raise BadEntryError("a run is [topic, queue id, messages] and optionally "
                                        "the queue count of a topic it creates")
                topic, queue_id, raw, *asked = raw_run
                runs.append(self._run(topic, queue_id, raw, False, asked, created))
                answers.append(None)
            except BrokerError as err:
                answers.append([err.code, getattr(err, "detail", str(err))])
            except (ValueError, TypeError) as err:  # a check that raised unnamed: this run is
                # refused by name, never the request (other clients' runs travel in it)
                answers.append([BadEntryError.code, f"malformed run: {str(err)[:200]}"])
        return runs, answers, created

    def _run(self, topic: Any, queue_id: Any, raw: Any, batch: bool, asked: list[Any],
             created: dict[str, int]) -> Run:
        """One run of a send request checked (``check_run``; ``asked``: the queue count asked
        for its topic, if given, into ``created`` capped at the broker's default, the first
        asked per topic kept), a delayed one routed to the schedule topic (whose real topic, if
        it is new, gets the broker's default count when it is due)."""
        config = self.host.config
        count = _created_queues(asked, config.default_queues)
        messages, size, with_props = self.check_run(topic, queue_id, raw, batch)
        if count is not None:
            created.setdefault(topic, count)
        if with_props:  # only a message with properties can be delayed
            try:
                topic, queue_id, messages = route_run(
                    topic, queue_id, messages, int(time.time() * 1000), config.delay_levels_ms,
                    config.max_delay_ms, batch)
            except DelayError as err:
                raise BadDelayError(str(err)) from err
        return topic, queue_id, messages, size

    def check_run(self, topic: Any, queue_id: Any, raw: Any,
                  batch: bool) -> tuple[list[list[Any]], int, bool]:
        """One run of a send request checked: every field, the sizes, the topic's state; its
        messages, their size and whether any has properties (``sendwire.wire_messages``)."""
        if type(queue_id) is not int:
            raise BadEntryError(f"the queue id must be an integer, not {queue_id!r}")
        config = self.host.config
        messages, size, with_props = wire_messages(
            validate_topic_name(topic, reserved=SEND_RESERVED_TOPICS), raw,
            config.max_message_bytes, batch)
        if self._key_only:  # THE CANARY: the sender's key alone, as before the scoping
            messages = [[*m[:3], r[3], *m[4:]] for m, r in zip(messages, raw, strict=True)]
        if not 0 <= queue_id < MAX_QUEUES:  # (no topic has it; past the entry's integers, it
            # would make every replica refuse the whole entry, other clients' runs with it)
            raise SendRefusedError("QUEUE_NOT_FOUND", f"queue id out of 0..{MAX_QUEUES - 1} "
                                   f"({topic})")
        cfg = self.host.state.topics.get(topic)
        if cfg is None and not config.auto_create_topics and topic != TRACE_TOPIC:
            raise SendRefusedError("TOPIC_NOT_FOUND", topic)
        if cfg is not None and not cfg.writable:
            raise SendRefusedError("NO_PERMISSION", f"{topic} is not writable")
        if cfg is not None and queue_id >= cfg.write_queues:
            raise SendRefusedError("QUEUE_NOT_FOUND", f"queue {queue_id} of {topic}")
        return messages, size, with_props

    def _propose(self, runs: list[tuple[RunKey, list[list[Any]]]],
                 queues: dict[str, int]) -> asyncio.Future[Committed]:
        ts_ms = int(time.time() * 1000)
        auto, default = self.host.config.auto_create_topics, self.host.config.default_queues
        # (the trace topic is created by its first send whatever the broker's auto-create says)
        if len(runs) == 1:  # one queue: the entry older replicas also read
            (topic, queue_id), messages = runs[0]
            data = encode_send(topic, queue_id, ts_ms, messages, auto or topic == TRACE_TOPIC,
                               queues.get(topic, default))
        else:
            data = encode_runs(ts_ms, [[t, q, msgs, auto or t == TRACE_TOPIC,
                                        queues.get(t, default)] for (t, q), msgs in runs])
        fut = self.host.node.submit(check_entry_size(data))
        self.host.metrics.proposed(fut)
        return fut

    def _answer(self, committed: Committed) -> list[list[Any]]:
        result = self.host.results.pop(committed.index, None)
        if result is None:
            raise BrokerError(f"no apply result for entry {committed.index}")
        store = self.host.node.store
        position = store.position_of(result.index) if store else 0
        return run_answers(self.host.group, position, result)


def _created_queues(asked: list[Any], default: int) -> int | None:
    """The queue count a send asks for a topic it creates (its optional last field), capped at
    the broker's ``default`` (RocketMQ's rule); None if not asked."""
    if not asked:
        return None
    n = asked[0]
    if type(n) is not int or not 1 <= n <= MAX_QUEUES:
        raise BadRequestError(f"the queue count of a topic a send creates must be "
                              f"1..{MAX_QUEUES}, not {n!r}")
    return min(n, default)


def _sole_answer(answer: list[Any]) -> list[Any]:
    """SEND's answer from its run's: the run's refusal becomes the request's error."""
    if answer[0] != SEND_OK:
        raise SendRefusedError(answer[0], answer[1])
    return answer


def _merge(answers: list[Any], got: list[list[Any]]) -> list[Any]:
    """SEND_RUNS' answers: those refused before proposing, the entry's in the other places."""
    it = iter(got)
    return [a if a is not None else next(it) for a in answers]
