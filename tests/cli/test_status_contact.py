"""A follower's last contact as ``dledger status`` (and the console, from the same view) shows it
when the leader never heard it in its term (issue 34, item 4): a node killed before the new
leader was elected reads "unreachable since <time> (as last seen by <node>)", from the latest
any member heard from it, not "never". The nodes' ``/status`` answers are given to the real
``group_status`` through a stand-in for the HTTP session."""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import Any

import aiohttp

from cli.status import status_table
from client.cluster.admin_views import group_status

NOW_MS = int(time.time() * 1000)


class _Answer:
    def __init__(self, body: dict[str, Any] | None) -> None:
        self.body = body

    async def __aenter__(self) -> _Answer:
        if self.body is None:
            raise aiohttp.ClientConnectionError("connection refused")
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        return None

    async def json(self) -> dict[str, Any]:
        assert self.body is not None
        return self.body


class _Session:
    """Answers ``GET http://<admin>/status`` from a table (None: the node does not answer)."""

    def __init__(self, answers: dict[str, dict[str, Any] | None]) -> None:
        self.answers = answers

    def get(self, url: str, **_: Any) -> _Answer:
        return _Answer(self.answers[url.split("//", 1)[1].split("/", 1)[0]])


def _status(node: str, role: str, followers: list[dict[str, Any]],
            heard: dict[str, int]) -> dict[str, Any]:
    """A broker's /status: ``heard`` maps each peer to how long ago (ms) this node heard it."""
    return {"group": "a", "tick_ms": 100, "applied_index": 9, "members": ["n0", "n1", "n2"],
            "membership": {"voters": ["n0", "n1", "n2"], "learners": []},
            "raft": {"node_id": node, "role": role, "term": 5, "last_index": 9,
                     "commit_index": 9, "followers": followers},
            "peers_last_heard": {p: {"at_ms": NOW_MS - ago, "ago_ms": ago}
                                 for p, ago in heard.items()}}


def _group(answers: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    cluster_group = {"group": "a", "term": 5, "leader": "n1", "nodes": [
        {"node_id": n, "admin_address": n} for n in ("n0", "n1", "n2")]}
    session: Any = _Session(answers)
    return asyncio.run(group_status(session, cluster_group))


def test_a_node_killed_before_the_election_reads_unreachable_since_as_last_seen_by_a_member(
        ) -> None:
    killed = {"node_id": "n0", "match_index": 7, "next_index": 8, "state": "probe",
              "last_contact_ticks": -1, "in_flight": 0}  # never heard in the new leader's term
    live = {"node_id": "n2", "match_index": 9, "next_index": 10, "state": "replicate",
            "last_contact_ticks": 1, "in_flight": 0}
    group = _group({
        "n0": None,
        "n1": _status("n1", "leader", [killed, live], {"n0": 41_000, "n2": 100}),
        "n2": _status("n2", "follower", [], {"n0": 40_000, "n1": 100}),
    })
    row = next(n for n in group["nodes"] if n["node"] == "n1")["followers"]["n0"]
    assert row["reachable"] is False and row["last_heard_by"] == "n2"  # the latest word of it
    assert (row["last_heard_ms"], row["last_heard_ago_ms"]) == (NOW_MS - 40_000, 40_000)
    since = time.strftime("%H:%M:%S", time.localtime((NOW_MS - 40_000) / 1000))
    table = status_table([group])
    assert f"n0: 2 / unreachable since {since}, 40 s ago (as last seen by n2)" in table, table
    assert "n2: 0 / 100 ms" in table and "never" not in table


def test_never_when_no_member_ever_heard_it_and_not_this_term_when_it_answers() -> None:
    silent = {"node_id": "n0", "match_index": 0, "next_index": 10, "state": "probe",
              "last_contact_ticks": -1, "in_flight": 0}
    group = _group({"n0": None, "n1": _status("n1", "leader", [silent], {}),
                    "n2": _status("n2", "follower", [], {})})
    assert "n0: 9 / never" in status_table([group])
    group = _group({"n0": _status("n0", "follower", [], {"n1": 5}),
                    "n1": _status("n1", "leader", [silent], {"n0": 3_000}),
                    "n2": _status("n2", "follower", [], {})})
    assert "n0: 9 / not heard this term (last seen " in status_table([group])
    assert ", 3 s ago, by n1)" in status_table([group])
