"""A broker node tells a consumer group's members when the group changes (RocketMQ's
NOTIFY_CONSUMER_IDS_CHANGED; issue 34 item 6): the group's membership version
(``broker.core.members``) moves when a member joins, leaves, expires or subscribes anew, not when
it only heartbeats again; the members on connections that can be told (``NoticeChannel``) are
told, all but the one whose heartbeat made the change, and a closed connection is told nothing
more. The client's side: which routes the watch reads again, and when
(``client.consumer.watch``)."""

from __future__ import annotations

import asyncio

from broker.core.members import GroupMembers
from broker.features.clients.service import ConsumerConnections
from client.consumer import watch
from client.consumer.watch import GroupWatch
from client.types import MessageQueue
from protocol import broker_kinds as bp


def test_the_version_moves_on_each_change_of_the_group_and_only_then() -> None:
    g = GroupMembers()
    assert g.version("cg") == 0
    g.heartbeat("c1", "cg", "clustering", {"t": "*"}, 30, now=0)
    joined = g.version("cg")
    assert joined != 0
    g.heartbeat("c1", "cg", "clustering", {"t": "*"}, 30, now=1)
    assert g.version("cg") == joined, "a heartbeat that changes nothing"
    g.heartbeat("c1", "cg", "clustering", {"t": "TagA"}, 30, now=2)
    resubscribed = g.version("cg")
    assert resubscribed != joined
    g.heartbeat("c2", "cg", "clustering", {"t": "TagA"}, 5, now=3)
    second = g.version("cg")
    assert second != resubscribed
    assert g.live("cg", now=9) == ["c1"]  # c2 expired
    expired = g.version("cg")
    assert expired != second
    g.heartbeat("c1", "cg", "clustering", {}, 0, now=10)  # leaves: the group is gone
    assert g.version("cg") == 0
    g.heartbeat("c1", "cg", "clustering", {"t": "*"}, 30, now=11)
    assert g.version("cg") not in (0, joined, resubscribed, second, expired), "never reused"


class Channel:
    def __init__(self, alive: bool = True) -> None:
        self.alive = alive
        self.told: list[str] = []

    def consumer_ids_changed(self, group: str) -> None:
        self.told.append(group)


def test_the_other_members_are_told_but_not_the_one_that_changed_it() -> None:
    consumers = ConsumerConnections()
    a, b, c, closed = Channel(), Channel(), Channel(), Channel(alive=False)
    for client_id, conn in (("a", a), ("b", b), ("c", c), ("d", closed)):
        consumers.heartbeat(client_id, "cg", conn, 30)
    consumers.heartbeat("x", "other", object(), 30)  # a connection that cannot be told
    consumers.members_changed("cg", by="b")
    assert (a.told, b.told, c.told, closed.told) == (["cg"], [], ["cg"], [])
    consumers.drop(a)
    consumers.members_changed("cg", by="c")
    assert (a.told, b.told, c.told) == (["cg"], ["cg"], ["cg"])
    consumers.members_changed("other", by="nobody")  # nobody to tell: nothing happens


def test_the_watch_reads_a_settling_route_often_and_a_settled_one_not_at_all() -> None:
    async def run() -> None:
        changed = asyncio.Event()
        w = GroupWatch(None, "me", "cg",  # type: ignore[arg-type]  # (no pull: nothing read)
                       {"t": "*", "%RETRY%cg": "*"}, "clustering", 5.0, changed)
        a = [MessageQueue("t", "a", q) for q in range(4)]
        b = [MessageQueue("t", "b", q) for q in range(4)]
        w.saw("t", a)  # the first read: settling, not a change
        assert not changed.is_set()
        looked = w._looked["t"]
        assert w.due(looked) == []
        assert w.due(looked + watch.ROUTE_POLL_S) == ["t"], "settling: read every poll"
        assert w.due(looked + watch.ROUTE_SETTLE_S + 1) == [], "settled"
        w.saw("t", a + b)  # group b appears: a change, and settling again
        assert changed.is_set()
        assert w.due(w._looked["t"] + watch.ROUTE_POLL_S) == ["t"]
        w.saw("t", ())  # the topic is gone: read every NOT_FOUND_POLL_S for good
        far = w._looked["t"] + watch.ROUTE_SETTLE_S + 100
        assert w.due(far) == ["t"]

    asyncio.run(run())


def test_a_notice_wakes_the_watch_only_for_its_own_group() -> None:
    async def run() -> None:
        w = GroupWatch(None, "me", "cg",  # type: ignore[arg-type]
                       {"t": "*"}, "clustering", 5.0, asyncio.Event())
        w._notice(bp.CONSUMER_IDS_CHANGED, ["other"])
        w._notice(bp.CHECK_TRANSACTION, ["cg"])
        w._notice(bp.CONSUMER_IDS_CHANGED, [])
        assert not w._noticed.is_set()
        w._notice(bp.CONSUMER_IDS_CHANGED, ["cg"])
        assert w._noticed.is_set()

    asyncio.run(run())


def test_an_expiry_a_status_read_saw_first_is_told_at_the_next_heartbeat() -> None:
    g = GroupMembers()
    g.heartbeat("c1", "cg", "clustering", {"t": "*"}, 30, now=0)
    g.heartbeat("c2", "cg", "clustering", {"t": "*"}, 5, now=0)
    assert g.untold("cg") and not g.untold("cg")  # the joins: told once
    assert g.live("cg", now=10) == ["c1"]  # (a status read: c2 expired here)
    g.heartbeat("c1", "cg", "clustering", {"t": "*"}, 30, now=11)  # changes nothing itself
    assert g.untold("cg"), "c2's expiry was never told"
    assert not g.untold("cg")
    g.heartbeat("c1", "cg", "clustering", {"t": "*"}, 0, now=12)  # the last member leaves
    assert not g.untold("cg")  # nobody left to tell; the group is forgotten
