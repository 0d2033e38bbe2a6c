"""A consumer group member's watch on what its share of the queues depends on, for the push and
lite pull consumers: the group's members and its topics' routes. Whenever either changes it sets
the owner's ``changed`` event, and the owner rebalances at once (besides its periodic rebalance).

- Members: a heartbeat to every node of the topics every ``heartbeat_s``, and at once when a
  node tells of a change (the broker's CONSUMER_IDS_CHANGED notice, RocketMQ's
  NOTIFY_CONSUMER_IDS_CHANGED: a member joined, left, expired or subscribed anew); the notices
  of one change from several nodes make one heartbeat.
- Routes: a topic's route is read again every ``ROUTE_POLL_S`` while it settles: from the
  first read (a topic created a moment ago is registered by each group's leader in turn, so the
  first route may name one group of two) until ``ROUTE_SETTLE_S`` pass without a change of its
  queues, again after any change, and after a pull found a queue of it missing. A subscribed
  topic with no route yet is read every ``NOT_FOUND_POLL_S``. Otherwise the periodic rebalance
  reads the routes (RocketMQ's clients poll them every 30 s).
- Subscriptions: when the group changes, the members' subscriptions as the brokers know them
  (CONSUMER_STATUS, one node per broker group) are compared; members that subscribe differently
  lose messages (``membership.subscription_conflict``), which is logged as a warning once per
  distinct difference (and once when it is gone).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from client import errors
from client.consumer import membership
from client.consumer.pull import PullConsumer
from client.types import MessageQueue
from protocol import broker_kinds as bp
from protocol.consume_rules import RETRY_PREFIX
from protocol.errors import DLedgerError

log = logging.getLogger("client.consumer.watch")

ROUTE_POLL_S = 0.5  # between two reads of a settling route
ROUTE_SETTLE_S = 10.0  # a route unchanged this long is settled (read again at the rebalance)
NOT_FOUND_POLL_S = 2.0  # between two reads of the route of a subscribed topic that has none
NOTICE_GATHER_S = 0.05  # the notices of one change from several nodes: one heartbeat


class GroupWatch:
    """``subs`` is the owner's own ``{topic: expression}`` (topics added to it later are
    watched too); ``changed`` the owner's event to rebalance on."""

    def __init__(self, pull: PullConsumer, client_id: str, group: str, subs: dict[str, str],
                 model: str, heartbeat_s: float, changed: asyncio.Event) -> None:
        self.pull, self.client_id, self.group, self.subs = pull, client_id, group, subs
        self.model, self.heartbeat_s, self.changed = model, heartbeat_s, changed
        self.members: list[str] = []
        self.conflict: str | None = None  # how the members' subscriptions differ, if they do
        self._noticed = asyncio.Event()
        self._seen: dict[str, frozenset[MessageQueue]] = {}  # topic -> its queues last read
        self._settle_until: dict[str, float] = {}  # topic -> read it often until then
        self._looked: dict[str, float] = {}  # topic -> when its route was last read here

    # -- members ------------------------------------------------------------------------------

    async def heartbeat(self, leave: bool = False, check: bool = False) -> None:
        """Heartbeat every node (``leave``: ttl 0); a change of the members sets ``changed`` and
        compares their subscriptions (``check``: compare them anyway)."""
        ttl_ms = 0 if leave else int(self.heartbeat_s * 3000)
        got = await membership.heartbeat(self.pull, self.client_id, self.group, self.subs,
                                         ttl_ms, self.model, None if leave else self._notice)
        if leave:
            return
        members = sorted(got | {self.client_id})
        if members != self.members:
            self.members = members
            self.changed.set()
            check = True
        if check:
            await self.check_subscriptions()

    def _notice(self, kind: int, fields: list[Any]) -> None:
        if kind == bp.CONSUMER_IDS_CHANGED and fields[:1] == [self.group]:
            self._noticed.set()

    async def heartbeats(self) -> None:
        """Heartbeat every ``heartbeat_s``, and at once after a node's notice."""
        while True:
            noticed = False
            try:
                async with asyncio.timeout(self.heartbeat_s):  # (not wait_for: see client.consumer.listening)
                    await self._noticed.wait()
                await asyncio.sleep(NOTICE_GATHER_S)  # the other nodes' notices of it
                noticed = True
            except TimeoutError:
                pass  # the heartbeat period
            self._noticed.clear()
            await self.heartbeat(check=noticed)

    async def check_subscriptions(self) -> None:
        """Compare the members' subscriptions (clustering only: a broadcasting member reads
        every queue of its own topics); warn once per distinct difference."""
        if self.model != "clustering":
            return
        try:
            views = await self._member_views()
        except (errors.ClientError, DLedgerError) as err:
            log.debug("the subscriptions of group %s were not compared: %s", self.group, err)
            return
        conflict = membership.subscription_conflict(views)
        if conflict == self.conflict:
            return
        if conflict is not None:
            log.warning("the members of consumer group %s subscribe differently, so messages "
                        "of queues given to a member that does not subscribe to them are never "
                        "consumed; give every member the same subscriptions: %s",
                        self.group, conflict)
        else:
            log.info("the members of consumer group %s subscribe alike again", self.group)
        self.conflict = conflict

    async def _member_views(self) -> list[dict[str, Any]]:
        """The members as one node of each broker group of the topics knows them (each member
        heartbeats the groups of its own topics only), merged by client id."""
        merged: dict[str, dict[str, Any]] = {}
        asked: set[str] = set()
        for topic in self._watched():
            for g in await self.pull.groups(topic):
                if g.group in asked:
                    continue
                asked.add(g.group)
                client = self.pull.group_client(g)
                st = await client.call(client.candidates()[0], bp.CONSUMER_STATUS, self.group,
                                       timeout_s=membership.HEARTBEAT_TIMEOUT_S)
                for m in st["members"]:
                    seen = merged.setdefault(m["client_id"], {**m, "subscriptions": {}})
                    seen["subscriptions"].update(m["subscriptions"])
        return list(merged.values())

    # -- routes -------------------------------------------------------------------------------

    def _watched(self) -> list[str]:
        return sorted(t for t in self.subs if not t.startswith(RETRY_PREFIX))

    def saw(self, topic: str, queues: Iterable[MessageQueue]) -> None:
        """The queues of ``topic`` as a route read just now says (none: no route): a change
        sets ``changed`` and watches the route closely for a while."""
        now = time.monotonic()
        fresh = frozenset(queues)
        self._looked[topic] = now
        old = self._seen.get(topic)
        self._seen[topic] = fresh
        if old != fresh:
            self._settle_until[topic] = now + ROUTE_SETTLE_S
            if old is not None:
                self.changed.set()

    def missing(self, topic: str) -> None:
        """A pull of a queue of ``topic`` failed: the queue may be gone, watch the route."""
        if topic in self._seen:
            self._settle_until[topic] = time.monotonic() + ROUTE_SETTLE_S

    def due(self, now: float) -> list[str]:
        """The topics whose route is to be read now."""
        out = []
        for topic in self._watched():
            settling = now < self._settle_until.get(topic, 0.0)
            looked = self._looked.get(topic, 0.0)
            if (settling and now >= looked + ROUTE_POLL_S) \
                    or (not self._seen.get(topic) and now >= looked + NOT_FOUND_POLL_S):
                out.append(topic)
        return out

    async def routes(self) -> None:
        """Read the routes that are due, every ``ROUTE_POLL_S``."""
        while True:
            await asyncio.sleep(ROUTE_POLL_S)  # the route watch's period
            for topic in self.due(time.monotonic()):
                try:
                    self.saw(topic, await self.pull.fetch_queues(topic, wait=False))
                except errors.TopicNotFoundError:
                    self.saw(topic, ())
                except errors.ClientError as err:  # no NameServer answered: the next round
                    log.debug("route of %s: %s", topic, err)
