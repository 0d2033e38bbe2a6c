"""Access control, RocketMQ's plain ACL done through the log: accounts and what each may do.

Owns the replicated part (pure, deterministic): ``Account`` (an access key, its secret, admin or
not, a default permission for topics and one for groups, and per-topic and per-group
permissions), ``AclTable`` (the accounts, changed only by applying the ACL entries of
``broker.features.acl.entries``, in every replica's checkpoint), and ``permits`` (may an account do what
a request needs). Permissions are RocketMQ's: DENY, PUB, SUB, PUB|SUB. A consumer group needs
SUB, a producer group (transactions) PUB; both defaults are DENY. A retry or dead-letter topic
(``%RETRY%g``, ``%DLQ%g``) is its group's: reading it needs SUB on group ``g``. The broker's own
topics (timers, half messages, rolled-back transactions) are an admin's only; the trace topic
follows the account's permissions. An admin account may do anything, the admin operations
included (topics, offsets reset, leadership, membership, ACL).

The signature check and the request table live in ``broker.features.acl.service`` (leader or not, every
node checks each request it serves).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from protocol.auth_rules import check_access_key, check_secret_key
from protocol.topics import TRACE_TOPIC, is_system_topic

__all__ = [
    "ACCOUNTS_MAX", "DENY", "PERMS_MAX", "PUB", "PUB_SUB", "SUB", "Account", "AclTable", "Need",
    "parse_perm", "perm_name", "permits",
]

DENY, PUB, SUB = 0, 1, 2
PUB_SUB = PUB | SUB
_NAMES = {DENY: "DENY", PUB: "PUB", SUB: "SUB", PUB_SUB: "PUB|SUB"}
_PARSE = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB_SUB, "SUB|PUB": PUB_SUB}
ACCOUNTS_MAX = 10_000
PERMS_MAX = 4096  # topic and group permissions of one account, together
NAME_CHARS_MAX = 255
RETRY_PREFIX, DLQ_PREFIX = "%RETRY%", "%DLQ%"


def parse_perm(text: Any) -> int:
    """``DENY``, ``PUB``, ``SUB`` or ``PUB|SUB`` (any case) as bits; ValueError otherwise."""
    perm = _PARSE.get(text.strip().upper()) if isinstance(text, str) else None
    if perm is None:
        raise ValueError(f"a permission is DENY, PUB, SUB or PUB|SUB, not {text!r}")
    return perm


def perm_name(perm: int) -> str:
    return _NAMES[perm]


def check_perm(perm: Any) -> int:
    if type(perm) is not int or perm not in _NAMES:
        raise ValueError(f"a permission is 0..3, not {perm!r}")
    return perm


# Seeded bug (tests only): "acl_local_only" changes the ACL on the leader alone, not through
# the log.
ACL_CANARIES = frozenset({"acl_local_only"})


@dataclass(frozen=True, slots=True)
class Account:
    access_key: str
    secret_key: str
    admin: bool = False
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    topic_perms: tuple[tuple[str, int], ...] = ()  # sorted by name
    group_perms: tuple[tuple[str, int], ...] = ()
    _topics: Mapping[str, int] = field(init=False, repr=False, compare=False)
    _groups: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_access_key(self.access_key)
        check_secret_key(self.secret_key)
        if not isinstance(self.admin, bool):
            raise ValueError("admin is a bool")
        check_perm(self.default_topic_perm)
        check_perm(self.default_group_perm)
        if len(self.topic_perms) + len(self.group_perms) > PERMS_MAX:
            raise ValueError(f"an account has at most {PERMS_MAX} topic and group permissions")
        for what, pairs in (("topic", self.topic_perms), ("group", self.group_perms)):
            names = [n for n, _ in pairs]
            if names != sorted(set(names)):
                raise ValueError(f"{what} permissions are sorted by name, each named once")
            for name, perm in pairs:
                if not isinstance(name, str) or not 0 < len(name) <= NAME_CHARS_MAX:
                    raise ValueError(f"a {what} name is 1..{NAME_CHARS_MAX} characters")
                check_perm(perm)
        object.__setattr__(self, "_topics", dict(self.topic_perms))
        object.__setattr__(self, "_groups", dict(self.group_perms))

    def __repr__(self) -> str:
        return f"Account({self.access_key!r}, admin={self.admin})"

    def topic_perm(self, topic: str) -> int:
        for prefix in (RETRY_PREFIX, DLQ_PREFIX):
            if topic.startswith(prefix):
                return SUB if self.group_perm(topic[len(prefix):]) & SUB else DENY
        if topic != TRACE_TOPIC and is_system_topic(topic):
            return DENY  # the broker's own (timers, half messages, ...): an admin's only
        return self._topics.get(topic, self.default_topic_perm)

    def group_perm(self, group: str) -> int:
        return self._groups.get(group, self.default_group_perm)

    def view(self) -> dict[str, Any]:
        """What ``dledger acl list`` shows: everything but the secret."""
        return {"access_key": self.access_key, "admin": self.admin,
                "default_topic_perm": perm_name(self.default_topic_perm),
                "default_group_perm": perm_name(self.default_group_perm),
                "topic_perms": {n: perm_name(p) for n, p in self.topic_perms},
                "group_perms": {n: perm_name(p) for n, p in self.group_perms}}

    def row(self) -> list[Any]:
        """The entry and checkpoint form."""
        return [self.access_key, self.secret_key, self.admin, self.default_topic_perm,
                self.default_group_perm, [list(p) for p in self.topic_perms],
                [list(p) for p in self.group_perms]]

    @classmethod
    def from_row(cls, row: Any) -> Account:
        if type(row) is not list or len(row) != 7:
            raise ValueError("an account is [key, secret, admin, topic default, group default, "
                             "topic perms, group perms]")
        key, secret, admin, dtp, dgp, topics, groups = row
        return cls(key, secret, admin, dtp, dgp, _pairs(topics), _pairs(groups))


def _pairs(v: Any) -> tuple[tuple[str, int], ...]:
    if type(v) is not list or len(v) > PERMS_MAX:
        raise ValueError(f"permissions are a list of at most {PERMS_MAX} [name, perm]")
    out = []
    for p in v:
        if type(p) is not list or len(p) != 2:
            raise ValueError("a permission is [name, perm]")
        out.append((p[0], p[1]))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Need:
    """What a request needs: ``kind`` "topic" or "group" with ``perm`` bits on ``name``, or
    "admin"."""

    kind: str
    name: str = ""
    perm: int = 0


ADMIN = Need("admin")


def permits(account: Account, needs: Iterable[Need]) -> str | None:
    """None if ``account`` may do all of ``needs``, else why not (for the refusal)."""
    if account.admin:
        return None
    for need in needs:
        if need.kind == "admin":
            return "an admin operation"
        have = account.topic_perm(need.name) if need.kind == "topic" else account.group_perm(need.name)
        if have & need.perm != need.perm:
            return (f"{perm_name(need.perm)} on {need.kind} {need.name!r} "
                    f"(the account has {perm_name(have)})")
    return None


class AclTable:
    """The accounts, as the ACL entries applied so far made them (every replica alike)."""

    def __init__(self) -> None:
        self.accounts: dict[str, Account] = {}

    def get(self, access_key: str) -> Account | None:
        return self.accounts.get(access_key)

    def put(self, account: Account) -> str:
        """Add or replace an account; "OK", or why not (every replica refuses alike)."""
        if account.access_key not in self.accounts and len(self.accounts) >= ACCOUNTS_MAX:
            return "ACL_FULL"
        self.accounts[account.access_key] = account
        return "OK"

    def delete(self, access_key: str) -> str:
        return "OK" if self.accounts.pop(access_key, None) is not None else "ACCOUNT_NOT_FOUND"

    def snapshot(self) -> list[Any]:
        return [self.accounts[k].row() for k in sorted(self.accounts)]

    @classmethod
    def restore(cls, rows: Any) -> AclTable:
        if type(rows) is not list:
            raise ValueError("the ACL is a list of accounts")
        table = cls()
        for row in rows:
            account = Account.from_row(row)
            table.accounts[account.access_key] = account
        return table
