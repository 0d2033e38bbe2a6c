"""Register-like sub-histories of a live chaos run (docs/testing.md): consumer offsets
committed to the broker and read back through the leader.

Each tail-following consumer commits its own group's offset for its queue every few seconds (the
offset only grows) and reads it back (the broker answers from the leader, behind a read barrier).
Two rules, per (group, queue):
- no stale read: a read invoked after a commit of ``x`` was acknowledged returns at least ``x``;
- no phantom: a read returns -1 (nothing committed yet) or a value some commit was invoked with.
Pure: plain Python over the history, O(n log n).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from typing import Any

Key = tuple[str, int]  # (consumer group, queue id)


def check_offset_reads(history: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """(stale reads, phantom reads) of committed consumer offsets, each anomaly a record."""
    invoked: dict[tuple[str, int, str], float] = {}  # (proc, op number, f) -> invoke time
    acked_commits: dict[Key, list[tuple[float, int]]] = defaultdict(list)  # (t_ok, value)
    attempted: dict[Key, set[int]] = defaultdict(set)
    reads: list[tuple[Key, float, int, dict[str, Any]]] = []  # (key, t_invoke, value, event)
    for ev in history:
        f = ev.get("f")
        if f not in ("offset-commit", "offset-read"):
            continue
        key = (str(ev["group"]), int(ev["queue"]))
        op = (str(ev["proc"]), int(ev["op"]), f)
        if ev["type"] == "invoke":
            invoked[op] = float(ev["t"])
            if f == "offset-commit":
                attempted[key].add(int(ev["value"]))
        elif ev["type"] == "ok" and op in invoked:
            if f == "offset-commit":
                acked_commits[key].append((float(ev["t"]), int(ev["value"])))
            else:
                reads.append((key, invoked[op], int(ev["value"]), ev))
    best_before: dict[Key, tuple[list[float], list[int]]] = {}
    for key, commits in acked_commits.items():
        commits.sort()
        times, running, best = [], [], -1
        for t, v in commits:
            best = max(best, v)
            times.append(t)
            running.append(best)
        best_before[key] = (times, running)
    stale: list[Any] = []
    phantom: list[Any] = []
    for key, t_invoke, value, ev in reads:
        times, running = best_before.get(key, ([], []))
        k = bisect_left(times, t_invoke)  # commits acknowledged strictly before the read began
        floor = running[k - 1] if k else -1
        if value < floor:
            stale.append({"group": key[0], "queue": key[1], "read": value,
                          "committed_before": floor, "t": ev["t"]})
        if value != -1 and value not in attempted[key]:
            phantom.append({"group": key[0], "queue": key[1], "read": value, "t": ev["t"]})
    return stale, phantom
