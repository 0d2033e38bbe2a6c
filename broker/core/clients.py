"""Client groups on one broker node: which clients of a group heartbeat, and over which
connection, so that the broker can send a server-initiated request on a client's own connection:
the transaction service asks a live producer of a group about its open transactions (RocketMQ's
check-back), an operator asks a consumer for its running information or to consume one message
(``broker.features.clients``).

In memory and per node, as RocketMQ's producer and consumer tables are (clients heartbeat every
node of the groups they use); a member that stops heartbeating expires, one whose connection
closes is gone at once. Pure (time passed in) and bounded; connections are opaque objects here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from broker.core.members import MAX_GROUPS, MAX_MEMBERS, MAX_TTL_S

C = TypeVar("C")


@dataclass(frozen=True, slots=True)
class Client(Generic[C]):
    client_id: str
    conn: C
    expires_at: float


class ClientGroups(Generic[C]):
    def __init__(self) -> None:
        self._groups: dict[str, dict[str, Client[C]]] = {}
        self._turn = 0  # round robin over a group's live members

    def heartbeat(self, client_id: str, group: str, conn: C, ttl_s: float,
                  now: float) -> list[str]:
        """Refresh (or, with ttl 0, remove) a client; the group's live clients."""
        members = self._groups.get(group)
        if members is None:
            if ttl_s <= 0 or len(self._groups) >= MAX_GROUPS:
                return []
            members = self._groups[group] = {}
        if ttl_s <= 0:
            members.pop(client_id, None)
        elif client_id in members or len(members) < MAX_MEMBERS:
            members[client_id] = Client(client_id, conn, now + min(ttl_s, MAX_TTL_S))
        self._expire(group, now)
        return sorted(self._groups.get(group, {}))

    def drop(self, conn: C) -> None:
        """A connection closed: its clients are gone."""
        for group in list(self._groups):
            members = self._groups[group]
            for client_id in [c for c, p in members.items() if p.conn is conn]:
                del members[client_id]
            if not members:
                del self._groups[group]

    def pick(self, group: str, now: float) -> Client[C] | None:
        """A live member of ``group`` to ask, the next one each time (a member that does not
        answer is passed over at the next check)."""
        members = self.live(group, now)
        if not members:
            return None
        self._turn += 1
        return members[self._turn % len(members)]

    def live(self, group: str, now: float) -> list[Client[C]]:
        """The live members of ``group``, by client id."""
        self._expire(group, now)
        return sorted(self._groups.get(group, {}).values(), key=lambda p: p.client_id)

    def find(self, group: str, client_id: str, now: float) -> Client[C] | None:
        """The live member ``client_id`` of ``group``, if it heartbeats here."""
        self._expire(group, now)
        return self._groups.get(group, {}).get(client_id)

    def snapshot(self, now: float) -> dict[str, list[str]]:
        for group in list(self._groups):
            self._expire(group, now)
        return {g: sorted(m) for g, m in sorted(self._groups.items())}

    def _expire(self, group: str, now: float) -> None:
        members = self._groups.get(group)
        if members is None:
            return
        for client_id in [c for c, p in members.items() if p.expires_at <= now]:
            del members[client_id]
        if not members:
            del self._groups[group]


__all__ = ["Client", "ClientGroups"]
