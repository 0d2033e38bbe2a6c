"""What an operator reads about a cluster, as plain JSON-ready dicts: each broker group's Raft
status from its nodes' admin endpoints (``/status``), with the group's health; a consumer
group's live members and per-queue progress from the brokers' CONSUMER_STATUS answers; and the
topics as the NameServer's ``/v1/cluster`` lists them, each with the broker groups serving it
(queue counts and permission) and whether it is a system topic.

Shared by ``dledger status`` / ``dledger consumer status`` (``cli``) and the NameServer's web
console (``namesrv.console_*``), so both show the same numbers. Owns no session and no
connection: the caller passes an ``aiohttp.ClientSession`` (its timeout bounds each request) or
a ``Routes``. A node that does not answer is a row with role ``unreachable`` and the error, never
an exception. Each of the leader's followers also carries when any member last heard from it
(``last_heard_ms``, ``last_heard_ago_ms``, ``last_heard_by``) and whether it answers
(``reachable``): a member that died before this leader took over was never heard by it in its
term, but the others (and the leader, as a follower before) heard it until it died.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from client.cluster.routes import GroupRoute, Routes
from client.consumer.membership import subscription_conflict
from protocol import broker_kinds as bp
from protocol.cluster_key import status_headers
from protocol.errors import DLedgerError
from protocol.tls import ENV_CA, tls_failure
from protocol.topics import is_system_topic

__all__ = [
    "consumer_views",
    "group_health",
    "group_status",
    "http_error_text",
    "last_seen",
    "node_status",
    "summarize_consumers",
    "topic_rows",
]

CONSUMER_STATUS_TIMEOUT_S = 3.0


def http_error_text(err: BaseException) -> str:
    """One readable phrase for an HTTP failure (aiohttp's own texts repeat the host and port)."""
    why = tls_failure(err)
    if why is not None:
        return why
    if isinstance(err, aiohttp.ClientConnectorError):
        return f"cannot connect: {err.os_error.strerror or err.os_error}"
    if isinstance(err, aiohttp.ServerDisconnectedError):
        return ("closed without an answer (a TLS listener? give --tls-ca)"
                if ENV_CA not in os.environ else "closed without an answer")
    if isinstance(err, TimeoutError):
        return "no answer in time"
    if isinstance(err, (aiohttp.ContentTypeError, ValueError)):
        return "the answer is not a NameServer's (no JSON)"
    return str(err) or type(err).__name__


def _contact_ms(ticks: Any, tick_ms: Any) -> int | None:
    """A follower's last contact in milliseconds (-1: never; None: the node's tick unknown)."""
    if not isinstance(ticks, int) or not isinstance(tick_ms, int):
        return None
    return -1 if ticks < 0 else ticks * tick_ms


def _last_heard(value: Any) -> dict[str, dict[str, int]]:
    """A node's ``peers_last_heard`` (peer -> ``at_ms``, ``ago_ms``), its well-formed rows only
    (a node of an older version has none)."""
    if not isinstance(value, dict):
        return {}
    return {str(peer): {"at_ms": row["at_ms"], "ago_ms": row["ago_ms"]}
            for peer, row in value.items()
            if isinstance(row, dict) and isinstance(row.get("at_ms"), int)
            and isinstance(row.get("ago_ms"), int)}


def last_seen(nodes: list[dict[str, Any]], peer: str) -> dict[str, Any] | None:
    """The latest any answering node heard from ``peer`` (any message: heartbeats, votes,
    answers), as ``{"at_ms", "ago_ms", "by"}``; None if none ever did."""
    best: dict[str, Any] | None = None
    for n in nodes:
        heard = (n.get("peers_last_heard") or {}).get(peer)
        if heard is not None and n["node"] != peer and (best is None
                                                        or heard["ago_ms"] < best["ago_ms"]):
            best = {**heard, "by": n["node"]}
    return best


def group_health(members: int, reachable: int, has_leader: bool) -> str:
    """"ok" (a leader, every voter answers), "degraded" (a leader and a majority), "no leader"
    (a majority answers but none leads), "no quorum" (fewer than a majority answer)."""
    if reachable * 2 <= members:
        return "no quorum"
    if not has_leader:
        return "no leader"
    return "ok" if reachable == members else "degraded"


@contextlib.asynccontextmanager
async def _slot(limit: asyncio.Semaphore | None) -> AsyncIterator[None]:
    if limit is None:
        yield
        return
    async with limit:
        yield


async def node_status(session: aiohttp.ClientSession, n: dict[str, Any],
                      limit: asyncio.Semaphore | None = None, *,
                      scheme: str = "http", status_key: bytes | None = None) -> dict[str, Any]:
    """One registered node (a ``/v1/cluster`` node entry) as its ``/status`` tells it; at most
    ``limit``'s count of requests run at once when one is given; the request signed with the
    cluster credential ``status_key`` when given (a broker with ``--protect-status``)."""
    try:
        async with _slot(limit), session.get(
                f"{scheme}://{n['admin_address']}/status",
                headers=status_headers(status_key, int(time.time() * 1000))) as resp:
            st = await resp.json()
        raft = st["raft"]
        return {"node": n["node_id"], "role": raft["role"], "term": raft["term"],
                "members": [m for m in st.get("members", ()) if isinstance(m, str)],
                "membership": st.get("membership") if isinstance(st.get("membership"), dict) else {},
                "last_index": raft["last_index"], "commit_index": raft["commit_index"],
                "applied_index": st["applied_index"],
                "consumer_groups": sorted({*(st.get("consumer_groups") or {}),
                                           *(st.get("offset_groups") or ())}),
                "followers": {f["node_id"]: {"lag": raft["last_index"] - f["match_index"],
                                             "last_contact_ticks": f["last_contact_ticks"],
                                             "last_contact_ms": _contact_ms(
                                                 f["last_contact_ticks"], st.get("tick_ms"))}
                              for f in raft["followers"]},
                "peers_last_heard": _last_heard(st.get("peers_last_heard"))}
    except (aiohttp.ClientError, TimeoutError, ValueError) as err:
        return {"node": n["node_id"], "role": "unreachable", "error": http_error_text(err)}
    except (KeyError, TypeError) as err:  # JSON, but not a broker's status
        return {"node": n["node_id"], "role": "unreachable",
                "error": f"not a broker's status (no {err})"}


async def group_status(session: aiohttp.ClientSession, g: dict[str, Any],
                       limit: asyncio.Semaphore | None = None, *,
                       scheme: str = "http", status_key: bytes | None = None) -> dict[str, Any]:
    """A ``/v1/cluster`` group with each node's status, the leader (the highest-term node that
    says it leads), the voters and learners (the leader's membership, else what the nodes
    name), and the health (``group_health``)."""
    nodes = list(await asyncio.gather(*(node_status(session, n, limit, scheme=scheme,
                                                    status_key=status_key)
                                        for n in g["nodes"])))
    leaders = sorted((n for n in nodes if n["role"] == "leader"), key=lambda n: n["term"])
    leader = leaders[-1] if leaders else None
    registered = {n["node"] for n in nodes}
    # The group's members as its nodes know them (a stopped node unregisters itself, so the
    # NameServer's list alone would make 1 of 3 look like a quorum of 1); the leader's
    # membership, when there is one, says who votes and who is a learner.
    membership = (leader or {}).get("membership") or {}
    voters = set(membership.get("voters", ()))
    learners = set(membership.get("learners", ()))
    members = set(leader["followers"]) if leader else set()
    if membership:
        members = voters | learners
        nodes = [n for n in nodes if n["node"] in members]  # (a removed node still running)
    else:
        for n in nodes:
            members.update(n.get("members", ()))
        voters = members
    for n in nodes:
        if n["node"] in learners and n["role"] == "follower":
            n["role"] = "learner"
    for nid in sorted(members - registered):
        nodes.append({"node": nid, "role": "unreachable", "error": "not registered"})
    answering = {n["node"] for n in nodes if n["role"] != "unreachable"}
    for fid, f in (leader or {}).get("followers", {}).items():
        # What the group knows of each follower beyond the leader's own contact in its term
        # (-1 for a member that died before this leader was elected): the latest any member
        # heard from it, and by whom.
        f["reachable"] = fid in answering
        seen = last_seen(nodes, fid)
        if seen is not None:
            f["last_heard_ms"], f["last_heard_ago_ms"], f["last_heard_by"] = (
                seen["at_ms"], seen["ago_ms"], seen["by"])
    voting = [n for n in nodes if n["node"] in voters]
    health = group_health(len(voting), sum(n["role"] != "unreachable" for n in voting),
                          leader is not None)
    return {"group": g["group"], "leader": leader["node"] if leader else None,
            "term": leader["term"] if leader else g["term"], "health": health,
            "voters": sorted(voters), "learners": sorted(learners),
            "change_in_progress": bool(membership.get("change_in_progress")),
            "nodes": sorted(nodes, key=lambda n: str(n["node"]))}


async def consumer_views(routes: Routes, g: GroupRoute, group: str,
                         timeout_s: float = CONSUMER_STATUS_TIMEOUT_S) -> list[dict[str, Any]]:
    """Every node's CONSUMER_STATUS answer for consumer group ``group`` (or its error) in
    broker group ``g``."""
    client = routes.group_client(g)

    async def one(node: str) -> dict[str, Any]:
        try:
            st = await client.call(node, bp.CONSUMER_STATUS, group, timeout_s=timeout_s)
        except DLedgerError as err:
            return {"group": g.group, "node": node, "error": str(err) or type(err).__name__}
        return {"group": g.group, **st, "node": node}
    return list(await asyncio.gather(*(one(n) for n in sorted(g.nodes))))


def summarize_consumers(group: str, views: list[dict[str, Any]]) -> dict[str, Any]:
    """The nodes' answers merged: each member once (with the nodes that see it), and each
    broker group's queues from its leader's answer (else from the most advanced node's);
    ``subscription_conflict``: how the clustering members' subscriptions differ (they lose
    messages), or None."""
    members: dict[str, dict[str, Any]] = {}
    unreachable = []
    best: dict[str, dict[str, Any]] = {}
    for v in views:
        where = f"{v['group']}/{v['node']}"
        if "error" in v:
            unreachable.append({"node": where, "error": v["error"]})
            continue
        for m in v["members"]:
            seen = members.setdefault(m["client_id"], {"client_id": m["client_id"],
                                                       "model": m["model"],
                                                       "subscriptions": {}, "seen_by": []})
            seen["subscriptions"].update(m["subscriptions"])
            seen["seen_by"].append(where)
        held = best.get(v["group"])
        if held is None or (v["leader"], _progress(v)) > (held["leader"], _progress(held)):
            best[v["group"]] = v
    queues = [{"topic": t, "queue": f"{g}/{q}", "committed": c, "max": hi,
               "lag": max(0, hi - max(c, 0)), "from_leader": v["leader"]}
              for g, v in sorted(best.items()) for t, q, c, hi in v["queues"]]
    queues.sort(key=lambda r: (r["topic"], r["queue"]))
    return {"group": group, "members": sorted(members.values(), key=lambda m: str(m["client_id"])),
            "subscription_conflict": subscription_conflict(members.values()),
            "queues": queues, "total_lag": sum(r["lag"] for r in queues),
            "unreachable": unreachable}


def _progress(view: dict[str, Any]) -> int:
    return sum(max(c, 0) for _, _, c, _ in view["queues"])


def topic_rows(groups: list[dict[str, Any]], only: str | None = None) -> list[dict[str, Any]]:
    """Every topic of the NameServer's ``/v1/cluster`` groups (or only ``only``), by name:
    ``{"topic", "system", "groups": {broker group: {"read_queues", "write_queues", "perm"}}}``;
    ``system``: a name RocketMQ reserves (retry, dead-letter, trace, schedule, ...)."""
    served: dict[str, dict[str, Any]] = {}
    for g in groups:
        for name, cfg in g["topics"].items():
            if only is None or name == only:
                served.setdefault(name, {})[g["group"]] = cfg
    return [{"topic": name, "system": is_system_topic(name), "groups": served[name]}
            for name in sorted(served)]
