"""The ACL's requests: ACL_PUT and ACL_DELETE (through the log, on the leader) and ACL_LIST (the
leader's accounts, without secrets), each field checked before it runs."""

from __future__ import annotations

import time
from typing import Any, Protocol

from broker.core.requests import Handler, handlers
from broker.features.acl.entries import AclDelete, AclPut
from broker.features.acl.model import Account
from broker.features.acl.service import AclService
from broker.features.host import BrokerHost
from protocol.auth_rules import check_access_key
from protocol.broker_kinds import ACL_DELETE, ACL_LIST, ACL_PUT, SendRefusedError

__all__ = ["HANDLERS", "acl_delete", "acl_list", "acl_put"]

HANDLERS: list[Handler] = []
handles = handlers(HANDLERS)


class AclHandlersHost(BrokerHost, Protocol):
    @property
    def acl(self) -> AclService: ...


def _account_row(v: Any) -> Account:
    return Account.from_row(v)


async def _change(host: AclHandlersHost, entry: AclPut | AclDelete) -> str:
    host.require_leader()
    if "acl_local_only" in host.config.canaries:  # the seeded bug: not through the log
        acl = host.state.acl
        return acl.put(entry.account) if isinstance(entry, AclPut) else acl.delete(entry.access_key)
    result = await host.commit(host.state.registry.encode(entry))
    if result.status != "OK":
        raise SendRefusedError(result.status, "the ACL change was refused")
    return result.status


@handles(ACL_PUT, account=_account_row)
async def acl_put(host: AclHandlersHost, account: Account) -> str:
    """Add or replace an account (leader; through the log)."""
    return await _change(host, AclPut(int(time.time() * 1000), account))


@handles(ACL_DELETE, access_key=check_access_key)
async def acl_delete(host: AclHandlersHost, access_key: str) -> str:
    """Delete an account (leader; through the log); ACCOUNT_NOT_FOUND if there is none."""
    return await _change(host, AclDelete(int(time.time() * 1000), access_key))


def _key_or_all(v: Any) -> str:
    return "" if v == "" else check_access_key(v)


@handles(ACL_LIST, access_key=_key_or_all)
async def acl_list(host: AclHandlersHost, access_key: str) -> list[dict[str, Any]]:
    """The accounts the leader knows ("" for all, else one), without secrets; the bootstrap
    admins (not in the log) flagged. Leader only (what every earlier change left)."""
    host.require_leader()
    views = [{**a.view(), "bootstrap": True} for a in host.acl.admins.values()]
    views += [{**a.view(), "bootstrap": False} for a in host.state.acl.accounts.values()]
    return sorted((v for v in views if not access_key or v["access_key"] == access_key),
                  key=lambda v: (v["access_key"], v["bootstrap"]))
