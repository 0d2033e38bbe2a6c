"""Checks Raft's invariants on the event traces of real nodes (``dledger.node.trace``): the same
properties the simulator's observer checks, replayed offline from JSON lines.

- at most one leader per term, over the whole run and across restarts;
- a node's term never decreases, across restarts too;
- one vote per term per node, across restarts (votes are traced once durable);
- committed entries never change: every (index) seen committed anywhere has one (term, crc);
- a node's commit index never decreases within one process life.

Returns a list of violations (empty when all hold); it never raises on odd input lines, it
reports them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def load(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    events = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    ev = json.loads(line)
                except json.JSONDecodeError:
                    ev = {"ev": "unreadable", "where": f"{path}:{n}"}
                events.append(ev)
    return events


def check(events: list[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    leaders: dict[int, set[str]] = defaultdict(set)
    term_of: dict[str, int] = {}
    votes: dict[tuple[str, int], str] = {}
    committed: dict[int, tuple[int, int]] = {}
    commit_of: dict[str, int] = {}
    for ev in events:  # in file order per node: the order each node wrote them
        kind, node = ev.get("ev"), ev.get("node", "?")
        if kind == "unreadable":
            problems.append(f"unreadable trace line at {ev['where']}")
        elif kind == "start":
            commit_of.pop(node, None)
        elif kind == "role":
            term = int(ev["term"])
            if term < term_of.get(node, 0):
                problems.append(f"{node}: term went back from {term_of[node]} to {term}")
            term_of[node] = max(term, term_of.get(node, 0))
            if ev["role"] == "leader":
                leaders[term].add(node)
        elif kind == "vote":
            key = (node, int(ev["term"]))
            if votes.setdefault(key, ev["voted_for"]) != ev["voted_for"]:
                problems.append(f"{node} voted for {votes[key]} and {ev['voted_for']} in term {key[1]}")
        elif kind == "commit":
            index, entry = int(ev["index"]), (int(ev["term"]), int(ev["crc"]))
            if committed.setdefault(index, entry) != entry:
                problems.append(f"{node} committed {entry} at {index}, another node {committed[index]}")
            if index < commit_of.get(node, 0):
                problems.append(f"{node}: commit index went back to {index}")
            commit_of[node] = index
    problems += [f"term {t} had leaders {sorted(ns)}" for t, ns in sorted(leaders.items()) if len(ns) > 1]
    return problems


def summary(events: list[dict[str, Any]]) -> dict[str, int]:
    terms = {int(e["term"]) for e in events if e.get("ev") == "role"}
    return {"events": len(events), "starts": sum(1 for e in events if e.get("ev") == "start"),
            "terms": len(terms),
            "leader_terms": len({int(e["term"]) for e in events
                                 if e.get("ev") == "role" and e.get("role") == "leader"}),
            "commits": sum(1 for e in events if e.get("ev") == "commit")}
