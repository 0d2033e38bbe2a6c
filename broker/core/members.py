"""Consumer-group membership on one broker node: which clients heartbeat, with which model and
subscriptions; a member that stops heartbeating expires. In memory and per node (clients
heartbeat every node), as RocketMQ's; pure (time passed in) and bounded."""

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

    def heartbeat(self, client_id: str, group: str, model: str, subs: dict[str, str],
                  ttl_s: float, now: float) -> list[str]:
        """Refresh (or, with ttl 0, remove) a member; returns the group's live members."""
        members = self._groups.setdefault(group, {}) if len(self._groups) < MAX_GROUPS \
            else self._groups.get(group, {})
        if ttl_s <= 0:
            members.pop(client_id, None)
        elif client_id in members or len(members) < MAX_MEMBERS:
            members[client_id] = Member(client_id, model, tuple(sorted(subs.items())),
                                        now + min(ttl_s, MAX_TTL_S))
        return self.live(group, now)

    def live(self, group: str, now: float) -> list[str]:
        members = self._groups.get(group, {})
        for cid in [c for c, m in members.items() if m.expires_at <= now]:
            del members[cid]
        if not members:
            self._groups.pop(group, None)
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
