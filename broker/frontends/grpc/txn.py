"""Transactions for RocketMQ 5 clients at the gRPC endpoint (``broker.frontends.grpc.gateway``): half
messages, EndTransaction, and the brokers' check-back as ``RecoverOrphanedTransactionCommand``
on the telemetry stream of a producer that publishes the topic.

A RocketMQ 5 producer has no producer group; our transactions (``broker.features.txn.model``) belong to one.
Each topic's gRPC transactions belong to the producer group ``%RMQ5_TXN%<topic>``, whose live
members are the gateways that hold a telemetry session of a producer declaring that topic
(``Settings.publishing.topics``): every ``HEARTBEAT_INTERVAL_S`` each such gateway heartbeats
the group to every node of the cluster (sooner after a round that missed a node, as
``client.producer.group`` does). A leader with an open
transaction past its timeout asks one of them; that gateway hands the question to one of its
producers of the topic, whose checker answers with EndTransaction (``SOURCE_SERVER_CHECK``).

The transaction id a client sees is ``<broker group>/<message id>``: the group that holds the
half message, and the id our transaction has there (the message id, which the client keeps
across its retries, so a retried half is stored once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as sv

from broker.frontends.grpc.codec import GatewayError, outbound
from client import errors
from client.cluster.routes import Routes
from client.producer.group import RETRY_S, CheckRequest, ProducerRegistration, next_pause_s, parse_check
from protocol import broker_kinds as bp

log = logging.getLogger("broker.grpc")

GROUP_PREFIX = "%RMQ5_TXN%"


def txn_group(topic: str) -> str:
    return GROUP_PREFIX + topic


def txn_text(broker_group: str, txn_id: str) -> str:
    return f"{broker_group}/{txn_id}"


def parse_txn(text: str) -> tuple[str, str]:
    group, sep, txn_id = text.partition("/")
    if not sep or not group or not txn_id:
        raise GatewayError(pb.Code.INVALID_TRANSACTION_ID, f"not a transaction id: {text[:80]!r}")
    return group, txn_id


class GatewayTransactions:
    """The gateway's producers' topics, their heartbeats and the check-backs' delivery."""

    def __init__(self, routes: Routes, client_id: str, sessions: dict[str, asyncio.Queue[Any]],
                 ensure_routes: Callable[[], Awaitable[None]]) -> None:
        self.routes = routes
        self.ensure_routes = ensure_routes
        self.client_id = client_id
        self.sessions = sessions  # client id -> its telemetry outbox (the gateway's)
        self.published: dict[str, frozenset[str]] = {}  # producer client id -> its topics
        self._registrations: dict[str, ProducerRegistration] = {}
        self._task: asyncio.Task[None] | None = None
        self.checks_delivered = 0
        self.checks_dropped = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for reg in self._registrations.values():
            with contextlib.suppress(errors.ClientError):
                await reg.beat(ttl_ms=0)

    def producer_settings(self, client_id: str, topics: frozenset[str]) -> None:
        """A producer session said which topics it publishes."""
        self.published[client_id] = topics

    def session_ended(self, client_id: str) -> None:
        self.published.pop(client_id, None)

    async def _loop(self) -> None:
        backoff_s = RETRY_S
        while True:
            missed = 0
            try:
                if self.published:
                    await self.ensure_routes()
                    await self.beat()
                missed = sum(reg.missed for reg in self._registrations.values())
            except errors.ClientError:  # no NameServer now: soon again
                missed = 1
            pause_s, backoff_s = next_pause_s(missed, backoff_s)
            await asyncio.sleep(pause_s if self._registrations else RETRY_S)  # (none yet: 1 s)

    async def beat(self) -> None:
        """Heartbeat the groups of the topics live producers publish; leave the others."""
        topics = {t for ts in self.published.values() for t in ts}
        for topic in topics - set(self._registrations):
            self._registrations[topic] = ProducerRegistration(self.routes, txn_group(topic),
                                                              self.client_id)
        for topic in list(self._registrations):
            reg = self._registrations[topic]
            if topic in topics:
                await reg.beat()
            else:
                del self._registrations[topic]
                await reg.beat(ttl_ms=0)
        for g in (reg.groups for reg in self._registrations.values()):
            for route in g.values():
                self.routes.group_client(route).set_push_handler(self._pushed)

    def _pushed(self, kind: int, fields: list[Any]) -> None:
        if kind != bp.CHECK_TRANSACTION:
            return
        check = parse_check(fields)
        if check is None or not check.producer_group.startswith(GROUP_PREFIX):
            self.checks_dropped += 1
            return
        self.deliver(check)

    def deliver(self, check: CheckRequest) -> None:
        """The check-back to one producer of the topic (the leader asks again later if none)."""
        topic = check.producer_group[len(GROUP_PREFIX):]
        for client_id, topics in self.published.items():
            outbox = self.sessions.get(client_id)
            if topic in topics and outbox is not None and not outbox.full():
                m = check.message
                cmd = sv.TelemetryCommand()
                cmd.recover_orphaned_transaction_command.transaction_id = txn_text(
                    check.broker_group, check.transaction_id)
                cmd.recover_orphaned_transaction_command.message.CopyFrom(outbound(
                    topic, m.queue.queue_id, m.queue_offset, m.body, m.tags, m.keys, m.msg_id,
                    m.properties, m.born_ts_ms, m.store_ts_ms))
                outbox.put_nowait(cmd)
                self.checks_delivered += 1
                return
        self.checks_dropped += 1


__all__ = ["GROUP_PREFIX", "GatewayTransactions", "parse_txn", "txn_group", "txn_text"]
