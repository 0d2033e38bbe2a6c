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

With access control on (``Signing``), the heartbeats of a topic's group are signed as the
account of a live producer session of the topic that may publish it (``PUB`` on the topic and
on the group ``%RMQ5_TXN%<topic>``, as its half messages and EndTransaction need: a producer
without them sends no transactions, and its topics are not heartbeaten); each such account's
requests go through a ``Routes`` of its own signing with its credentials as the ACL has them
(a new secret: new ones), closed once no topic is heartbeaten with them. A check-back, which
carries the half message, goes only to a session whose account may publish the topic then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as sv

from broker.frontends.grpc.codec import GatewayError, outbound
from client import errors
from client.cluster.routes import Routes
from client.producer.group import RETRY_S, CheckRequest, ProducerRegistration, next_pause_s, parse_check
from protocol import broker_kinds as bp
from protocol.auth import Credentials

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


@dataclass(frozen=True)
class Signing:
    """Access control's part (``--acl``): may an account (None: a session that named none)
    publish a topic's transactions now; an account's credentials (it may publish: it is one);
    a new, unstarted ``Routes`` whose requests are signed with credentials."""

    may_publish: Callable[[str | None, str], bool]
    credentials: Callable[[str], Credentials]
    routes_as: Callable[[Credentials], Routes]


class GatewayTransactions:
    """The gateway's producers' topics, their heartbeats and the check-backs' delivery."""

    def __init__(self, routes: Routes, client_id: str, sessions: dict[str, asyncio.Queue[Any]],
                 ensure_routes: Callable[[], Awaitable[None]],
                 signing: Signing | None = None) -> None:
        self.routes = routes
        self.ensure_routes = ensure_routes
        self.client_id = client_id
        self.sessions = sessions  # client id -> its telemetry outbox (the gateway's)
        self.signing = signing
        self.published: dict[str, frozenset[str]] = {}  # producer client id -> its topics
        self.accounts: dict[str, str | None] = {}  # producer client id -> its account (--acl)
        # topic -> its group's registration, and whom it heartbeats as (None: unsigned)
        self._registrations: dict[str, tuple[ProducerRegistration, Credentials | None]] = {}
        self._signed_routes: dict[Credentials, Routes] = {}  # (--acl)
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
        for reg, _ in self._registrations.values():
            with contextlib.suppress(errors.ClientError):
                await reg.beat(ttl_ms=0)
        self._registrations.clear()
        await self._close_unused()

    def producer_settings(self, client_id: str, topics: frozenset[str],
                          account: str | None = None) -> None:
        """A producer session said which topics it publishes (``account``: the one its
        telemetry stream was authenticated as, with --acl)."""
        self.published[client_id] = topics
        self.accounts[client_id] = account

    def session_ended(self, client_id: str) -> None:
        self.published.pop(client_id, None)
        self.accounts.pop(client_id, None)

    def _may_publish(self, client_id: str, topic: str) -> bool:
        return self.signing is None or self.signing.may_publish(self.accounts.get(client_id),
                                                                topic)

    async def _loop(self) -> None:
        backoff_s = RETRY_S
        while True:
            missed = 0
            try:
                if self.published or self._registrations:
                    await self.ensure_routes()
                    await self.beat()
                missed = sum(reg.missed for reg, _ in self._registrations.values())
            except errors.ClientError:  # no NameServer now: soon again
                missed = 1
            pause_s, backoff_s = next_pause_s(missed, backoff_s)
            await asyncio.sleep(pause_s if self._registrations else RETRY_S)  # (none yet: 1 s)

    def _signers(self) -> dict[str, Credentials | None]:
        """The topics to heartbeat, each with the credentials to sign with: those of the first
        live session's account that may publish it (None without access control)."""
        out: dict[str, Credentials | None] = {}
        for client_id, topics in self.published.items():
            account = self.accounts.get(client_id)
            for topic in topics:
                if topic in out or not self._may_publish(client_id, topic):
                    continue
                out[topic] = None if self.signing is None or account is None \
                    else self.signing.credentials(account)
        return out

    async def beat(self) -> None:
        """Heartbeat the groups of the topics live producers publish; leave the others."""
        wanted = self._signers()
        for topic, (reg, signer) in list(self._registrations.items()):
            if topic not in wanted or wanted[topic] != signer:  # gone, or another signer's now
                del self._registrations[topic]
                await reg.beat(ttl_ms=0)
        for topic, signer in wanted.items():
            if topic not in self._registrations:
                routes = await self._routes_of(signer)
                self._registrations[topic] = (ProducerRegistration(
                    routes, txn_group(topic), self.client_id), signer)
            reg = self._registrations[topic][0]
            await reg.beat()
            for route in reg.groups.values():
                reg.routes.group_client(route).set_push_handler(self._pushed)
        await self._close_unused()

    async def _routes_of(self, signer: Credentials | None) -> Routes:
        if signer is None or self.signing is None:
            return self.routes
        routes = self._signed_routes.get(signer)
        if routes is None:
            routes = self.signing.routes_as(signer)
            await routes.start()
            self._signed_routes[signer] = routes
        return routes

    async def _close_unused(self) -> None:
        used = {signer for _, signer in self._registrations.values()}
        for signer in [c for c in self._signed_routes if c not in used]:
            await self._signed_routes.pop(signer).close()

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
            if topic in topics and outbox is not None and not outbox.full() \
                    and self._may_publish(client_id, topic):
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


__all__ = ["GROUP_PREFIX", "GatewayTransactions", "Signing", "parse_txn", "txn_group", "txn_text"]
