"""A producer's membership of its producer group (RocketMQ's ``DefaultMQProducer("pg")``): it
heartbeats every node of every broker group of the cluster, so that any of them can name the
group's live producers, and a leader holding an open transaction of the group can ask one of
them about it over that producer's own connection (a server-initiated CHECK_TRANSACTION frame,
handed to ``on_check``). Owns one background task; its heartbeats are bounded by deadlines.

A round that misses a node (down, restarting; or no NameServer answers) is repeated after
``RETRY_S``, the pause doubling while rounds keep missing up to the period, so that a node back
from a short crash knows the group's producers within a few seconds: it may lead next, and the
check-backs it sends until it knows one go unanswered (and count toward the transaction's
``check_max``). A node that never answers this producer (down for good, or refusing it) costs a
round per period, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from client import errors
from client.cluster.routes import GroupRoute, Routes
from client.consumer.pull import _message
from client.identity import new_client_id  # (the producers' default id, as every client's)
from client.types import MessageQueue, ReceivedMessage
from protocol import broker_kinds as bp
from protocol.errors import DLedgerError

HEARTBEAT_INTERVAL_S = 10.0
HEARTBEAT_TTL_MS = 35_000  # three heartbeats and some: a producer that stops is gone soon
HEARTBEAT_TIMEOUT_S = 2.0  # one node's answer
RETRY_S = 1.0  # a round that missed a node is repeated this soon, then 2, 4... s up to the period
GROUP_MAX_CHARS = 255
_pause = asyncio.sleep  # the loop's wait between rounds (a test records it)


@dataclass(frozen=True, slots=True)
class CheckRequest:
    """A broker's question about an open transaction: ``message`` is its first half message
    (``topic`` and ``queue`` its real ones), ``checks`` how many times it has been asked."""

    broker_group: str
    producer_group: str
    transaction_id: str
    checks: int
    message: ReceivedMessage


def check_group(group: str) -> str:
    if type(group) is not str or not 0 < len(group) <= GROUP_MAX_CHARS:
        raise ValueError(f"a producer group is a name of 1..{GROUP_MAX_CHARS} characters, "
                         f"not {group!r}")
    return group


def parse_check(fields: list[Any]) -> CheckRequest | None:
    """A CHECK_TRANSACTION frame's fields, or None if they are not one's."""
    try:
        broker_group, producer_group, txn_id, checks, messages = fields
        r = messages[0]
        props = dict((k, v) for k, v in r[5])
        mq = MessageQueue(props.get("REAL_TOPIC", ""), str(broker_group),
                          int(props.get("REAL_QID", "0")))
        return CheckRequest(str(broker_group), str(producer_group), str(txn_id), int(checks),
                            _message(mq, r))
    except (TypeError, ValueError, IndexError, KeyError):
        return None


class ProducerRegistration:
    def __init__(self, routes: Routes, group: str, client_id: str,
                 on_check: Callable[[CheckRequest], None] | None = None) -> None:
        self.routes = routes
        self.group = check_group(group)
        self.client_id = client_id
        self.on_check = on_check
        self.groups: dict[str, GroupRoute] = {}  # the cluster's broker groups, last seen
        self.malformed_checks = 0
        self.missed = 0  # nodes the last round did not reach
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """The first heartbeat round (every node it reaches knows this producer), then one
        every ``HEARTBEAT_INTERVAL_S`` in the background."""
        await self.beat()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(errors.ClientError):
            await self.beat(ttl_ms=0)  # leave: the brokers ask the others from now on

    async def _loop(self) -> None:
        pause_s, backoff_s = next_pause_s(self.missed, RETRY_S)
        while True:
            await _pause(pause_s)  # the heartbeat period, or sooner after a round that missed
            try:
                await self.beat()
            except errors.ClientError:  # no NameServer now: soon again
                self.missed = 1
            pause_s, backoff_s = next_pause_s(self.missed, backoff_s)

    async def beat(self, ttl_ms: int = HEARTBEAT_TTL_MS) -> set[str]:
        """Heartbeat every node of every broker group at once; the group's producers any node
        knows of. A node that does not answer is skipped."""
        self.groups = {g.group: g for g in await self.routes.cluster_groups()}

        async def one(g: GroupRoute, node: str) -> list[str] | None:
            client = self.routes.group_client(g)
            if self.on_check is not None:
                client.set_push_handler(self._pushed)
            try:
                got = await client.call(node, bp.PRODUCER_HEARTBEAT, self.client_id, self.group,
                                        ttl_ms, timeout_s=HEARTBEAT_TIMEOUT_S)
            except DLedgerError:
                return None
            return [str(c) for c in got]

        calls = [one(g, node) for g in self.groups.values() for node in g.nodes]
        answers = await asyncio.gather(*calls)
        self.missed = sum(got is None for got in answers)
        return {c for got in answers if got is not None for c in got}

    def _pushed(self, kind: int, fields: list[Any]) -> None:
        if kind != bp.CHECK_TRANSACTION or self.on_check is None:
            return
        check = parse_check(fields)
        if check is None or check.producer_group != self.group:
            self.malformed_checks += 1
            return
        self.on_check(check)


def next_pause_s(missed: int, backoff_s: float) -> tuple[float, float]:
    """(the pause before the next round, the backoff after that one) once a round missed
    ``missed`` nodes: the period if none, else ``backoff_s``, doubling up to the period."""
    if missed == 0:
        return HEARTBEAT_INTERVAL_S, RETRY_S
    return backoff_s, min(2 * backoff_s, HEARTBEAT_INTERVAL_S)


__all__ = ["CheckRequest", "ProducerRegistration", "check_group", "new_client_id",
           "next_pause_s"]
