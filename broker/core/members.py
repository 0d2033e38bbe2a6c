"""Consumer-group membership on one broker node: which clients heartbeat, with which model and
subscriptions; a member that stops heartbeating expires. In memory and per node (clients
heartbeat every node), as RocketMQ's; pure (time passed in) and bounded.

``version(group)`` changes whenever a member joins, leaves or expires, or changes its model or
subscriptions (RocketMQ's broker notifies the group's consumers on exactly these:
NOTIFY_CONSUMER_IDS_CHANGED); versions come from one counter, so a group that empties and
comes back never repeats an old one."""

from __future__ import annotations

from dataclasses import dataclass

MAX_TTL_S = 300.0
MAX_GROUPS = 10_000
MAX_MEMBERS = 1_000


@dataclass(frozen=True, slots=True)
class Member:
    client_id: str
    model: str  # "clustering" or "broadcasting"
    subscriptions: tuple[tuple[str, str], ...]  # (topic, tag expression)
    expires_at: float


class GroupMembers:
    def __init__(self) -> None:
        self._groups: dict[str, dict[str, Member]] = {}
        self._versions: dict[str, int] = {}  # group -> the count at its last change
        self._told: dict[str, int] = {}  # group -> the version its consumers were last told of
        self._changes = 0

    def heartbeat(self, client_id: str, group: str, model: str, subs: dict[str, str],
                  ttl_s: float, now: float) -> list[str]:
        """Refresh (or, with ttl 0, remove) a member; returns the group's live members."""
        members = self._groups.setdefault(group, {}) if len(self._groups) < MAX_GROUPS \
            else self._groups.get(group, {})
        old = members.get(client_id)
        if ttl_s <= 0:
            if members.pop(client_id, None) is not None:
                self._changed(group)
        elif old is not None or len(members) < MAX_MEMBERS:
            new = Member(client_id, model, tuple(sorted(subs.items())), now + min(ttl_s, MAX_TTL_S))
            members[client_id] = new
            if old is None or (old.model, old.subscriptions) != (new.model, new.subscriptions):
                self._changed(group)
        return self.live(group, now)

    def version(self, group: str) -> int:
        """Changes whenever the group's members or their subscriptions change (0: no member)."""
        return self._versions.get(group, 0)

    def untold(self, group: str) -> bool:
        """Whether the group changed since this last answered True for it (its consumers are
        then told): an expiry first seen by a status read is told at the next heartbeat."""
        version = self._versions.get(group, 0)
        if version == 0 or self._told.get(group) == version:
            return False
        self._told[group] = version
        return True

    def _changed(self, group: str) -> None:
        self._changes += 1
        self._versions[group] = self._changes

    def live(self, group: str, now: float) -> list[str]:
        members = self._groups.get(group, {})
        expired = [c for c, m in members.items() if m.expires_at <= now]
        for cid in expired:
            del members[cid]
        if expired:
            self._changed(group)
        if not members:
            self._groups.pop(group, None)
            self._versions.pop(group, None)
            self._told.pop(group, None)
        return sorted(members)

    def members(self, group: str, now: float) -> list[Member]:
        """The group's live members with their model and subscriptions, by client id."""
        live = self.live(group, now)
        members = self._groups.get(group, {})
        return [members[c] for c in live]

    def topic_groups(self, now: float) -> dict[str, set[str]]:
        """Topic -> the groups with a live member subscribed to it."""
        out: dict[str, set[str]] = {}
        for group in list(self._groups):
            for m in self.members(group, now):
                for topic, _ in m.subscriptions:
                    out.setdefault(topic, set()).add(group)
        return out

    def snapshot(self, now: float) -> dict[str, list[str]]:
        return {g: self.live(g, now) for g in sorted(self._groups)}
