"""How a clustering consumer group shares a topic's queues: RocketMQ's allocation strategies as
pure functions of (this client, all clients, the topic's queues). Every member computes the same
answer from the same inputs, so each queue has exactly one consumer without any coordination.

Chosen by name (``STRATEGIES``: ``averagely``, ``by_circle``, ``consistent_hash``) or, for those
that take a configuration, built by a factory and given as they are (``strategy_of``):

- ``by_config(queues)``: RocketMQ's AllocateMessageQueueByConfig: exactly the queues given (those
  of the topic that exist), whoever else is in the group.
- ``by_machine_room(rooms)``: AllocateMessageQueueByMachineRoom: the queues of the broker groups in
  these machine rooms, shared (``averagely`` by default) by all the members, which are all
  configured alike; the other queues are nobody's.
- ``machine_room_nearby()``: AllocateMachineRoomNearby: the queues of each room shared by the
  members in that room; those of a room with no member (or of a group with no room) by all.

Machine rooms (RocketMQ names a broker ``room@brokerName``; a group name cannot hold ``@``): a
broker group's room is its entry in ``group_rooms`` when given, else the part of its name before
its first ``.`` (group ``east.a`` is in room ``east``), else it has none. A member's room, which
every member must work out alike from the client ids alone, is ``client_room(client_id)``; by
default the part of the id before its first ``@`` (``east@worker-1``; a default client id starts
with the host name, so name the hosts by room, or give the client ids, or a resolver)."""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from client.types import MessageQueue

Strategy = Callable[[str, Sequence[str], Sequence[MessageQueue]], list[MessageQueue]]


def averagely(me: str, clients: Sequence[str], queues: Sequence[MessageQueue]) -> list[MessageQueue]:
    """Contiguous ranges: with 8 queues and 3 clients, 3 + 3 + 2."""
    cs, qs = sorted(clients), sorted(queues)
    if me not in cs or not qs:
        return []
    k, n = cs.index(me), len(cs)
    base, extra = divmod(len(qs), n)
    start = k * base + min(k, extra)
    return qs[start : start + base + (1 if k < extra else 0)]


def by_circle(me: str, clients: Sequence[str], queues: Sequence[MessageQueue]) -> list[MessageQueue]:
    """Round robin: queue i goes to client i mod n."""
    cs, qs = sorted(clients), sorted(queues)
    if me not in cs:
        return []
    k, n = cs.index(me), len(cs)
    return [q for i, q in enumerate(qs) if i % n == k]


def consistent_hash(me: str, clients: Sequence[str], queues: Sequence[MessageQueue],
                    virtual_nodes: int = 16) -> list[MessageQueue]:
    """Each queue goes to the first client clockwise on a hash ring (few moves on membership
    changes)."""
    if me not in clients:
        return []
    ring = sorted((_h(f"{c}#{v}"), c) for c in sorted(set(clients)) for v in range(virtual_nodes))
    points = [p for p, _ in ring]
    out = []
    for q in sorted(queues):
        i = bisect.bisect(points, _h(f"{q.topic}/{q.group}/{q.queue_id}")) % len(ring)
        if ring[i][1] == me:
            out.append(q)
    return out


def _h(text: str) -> int:
    return zlib.crc32(text.encode())


STRATEGIES: dict[str, Strategy] = {"averagely": averagely, "by_circle": by_circle,
                                   "consistent_hash": consistent_hash}
CONFIGURED = {"by_config": "by_config(queues)", "machine_room": "by_machine_room(rooms)",
              "machine_room_nearby": "machine_room_nearby()"}  # built by their factories


def strategy_of(strategy: str | Strategy) -> Strategy:
    """A strategy given by name (``STRATEGIES``) or built (a factory's, or the caller's own
    function); ValueError for an unknown name, or one whose strategy needs a configuration."""
    if callable(strategy):
        return strategy
    if strategy in CONFIGURED:
        raise ValueError(f"strategy {strategy!r} takes a configuration: give "
                         f"strategy=client.consumer.rebalance.{CONFIGURED[strategy]}")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy is one of {', '.join(STRATEGIES)} or a strategy built by "
                         f"{', '.join(CONFIGURED.values())}, not {strategy!r}")
    return STRATEGIES[strategy]


def by_config(queues: Iterable[MessageQueue]) -> Strategy:
    """Exactly ``queues`` (of each topic, those that exist), whoever else is in the group."""
    fixed = frozenset(queues)
    if not fixed or not all(isinstance(q, MessageQueue) for q in fixed):
        raise ValueError("by_config takes one MessageQueue or more")

    def allocate(me: str, clients: Sequence[str],
                 queues: Sequence[MessageQueue]) -> list[MessageQueue]:
        return sorted(q for q in queues if q in fixed)
    return allocate


def room_of_group(group: str, group_rooms: Mapping[str, str] | None = None) -> str | None:
    """A broker group's machine room: ``group_rooms[group]``, else its name's part before its
    first ``.``, else None."""
    if group_rooms is not None and group in group_rooms:
        return group_rooms[group]
    room, dot, _ = group.partition(".")
    return room if dot and room else None


def room_of_client(client_id: str) -> str | None:
    """A member's machine room by default: its client id's part before the first ``@``."""
    room, at, _ = client_id.partition("@")
    return room if at and room else None


def by_machine_room(rooms: Collection[str], group_rooms: Mapping[str, str] | None = None,
                    inner: Strategy = averagely) -> Strategy:
    """The queues of the broker groups in ``rooms``, shared by every member with ``inner``."""
    wanted = frozenset(rooms)
    if not wanted or not all(isinstance(r, str) and r for r in wanted):
        raise ValueError(f"by_machine_room takes one room name or more, not {rooms!r}")

    def allocate(me: str, clients: Sequence[str],
                 queues: Sequence[MessageQueue]) -> list[MessageQueue]:
        return inner(me, clients, [q for q in queues if room_of_group(q.group, group_rooms)
                                   in wanted])
    return allocate


def machine_room_nearby(inner: Strategy = averagely, group_rooms: Mapping[str, str] | None = None,
                        client_room: Callable[[str], str | None] = room_of_client) -> Strategy:
    """Each room's queues shared with ``inner`` by the members in that room; the queues of a
    room with no member, or of a group with no room, by every member."""
    def allocate(me: str, clients: Sequence[str],
                 queues: Sequence[MessageQueue]) -> list[MessageQueue]:
        if me not in clients:
            return []
        members: dict[str | None, list[str]] = {}
        for c in clients:
            members.setdefault(client_room(c), []).append(c)
        by_room: dict[str | None, list[MessageQueue]] = {}
        for q in queues:
            by_room.setdefault(room_of_group(q.group, group_rooms), []).append(q)
        mine: list[MessageQueue] = []
        for room, room_queues in by_room.items():
            if room is not None and room in members:  # (my room's, or another room's: not mine)
                if room == client_room(me):
                    mine += inner(me, members[room], room_queues)
            else:  # nobody near them: every member shares them
                mine += inner(me, clients, room_queues)
        return sorted(mine)
    return allocate
