"""Liveness measurements of one live chaos run (docs/testing.md): ack
counts, ack latency, windows without acks, recovery after the heal, time to the next ack after each
fault, ack rates inside and outside fault windows, and leadership (terms, leader changes, a leader
timeline) from the nodes' trace events.

These are measurements, never pass/fail criteria (``chaos.live.checkers.safety`` owns the verdict). Pure:
no I/O, no clock; dicts, sorts and bisect over the recorded history, O(n log n).
History times are wall-clock seconds (``time.time()``); trace times are nanoseconds.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left, bisect_right
from collections import defaultdict
from typing import Any

__all__ = ["availability", "leadership", "percentile"]


def percentile(sorted_xs: list[float], p: float) -> float | None:
    """Nearest-rank percentile of an ascending list (None when empty)."""
    if not sorted_xs:
        return None
    return sorted_xs[max(0, math.ceil(p / 100.0 * len(sorted_xs)) - 1)]


def _fault_windows(nemesis: list[dict[str, Any]], end: float) -> list[tuple[float, float]]:
    """[start, stop) windows of every fault, merged; a start without its stop lasts until ``end``."""
    open_at: dict[tuple[str, tuple[str, ...]], list[float]] = defaultdict(list)
    windows: list[tuple[float, float]] = []
    for ev in nemesis:
        key = (str(ev.get("fault")), tuple(sorted(ev.get("nodes") or ())))
        if ev.get("f") == "start":
            open_at[key].append(float(ev["t"]))
        elif ev.get("f") == "stop":  # the same fault on the same nodes, else the same fault
            match = key if open_at[key] else next((k for k, ts in open_at.items()
                                                    if k[0] == key[0] and ts), None)
            if match is not None:
                windows.append((open_at[match].pop(0), float(ev["t"])))
    windows += [(t, max(t, end)) for starts in open_at.values() for t in starts]
    merged: list[tuple[float, float]] = []
    for a, b in sorted(windows):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def availability(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts, latency and availability windows of the sends in ``history``.

    Keys: attempted, ok, fail, info, pending (invoked, never completed), info_share, latency_ms
    (p50/p95/p99/max, invoke to ok), longest_gap_s and longest_gap (where: the longest stretch
    without an ok between the first invoke and the final heal), recovery_s (final heal to the first
    ok of a send invoked after it), time_to_next_ack_s (per fault kind: seconds from each ``start``
    to the next ok answered by a node outside the fault; values, median, never), ack_rate_healthy
    and ack_rate_fault (ok/s outside and inside fault windows), fault_s (time inside them)."""
    invoked: dict[str, float] = {}
    outcome_n = {"ok": 0, "fail": 0, "info": 0}
    oks: list[tuple[float, str, str]] = []  # (t_ok, node, value)
    nemesis = [ev for ev in history if ev.get("proc") == "nemesis"]
    for ev in history:
        if ev.get("f") != "send":
            continue
        if ev["type"] == "invoke":
            invoked.setdefault(ev["value"], float(ev["t"]))
        elif ev["type"] in outcome_n:
            outcome_n[ev["type"]] += 1
            if ev["type"] == "ok":
                oks.append((float(ev["t"]), str(ev.get("node")), ev["value"]))
    oks.sort()
    ok_times = [t for t, _, _ in oks]
    attempted = len(invoked)
    out: dict[str, Any] = {"attempted": attempted, **outcome_n,
                           "pending": max(0, attempted - sum(outcome_n.values())),
                           "info_share": outcome_n["info"] / attempted if attempted else None}
    lat = sorted(1000.0 * (t - invoked[v]) for t, _, v in oks if v in invoked)
    out["latency_ms"] = {"p50": percentile(lat, 50), "p95": percentile(lat, 95),
                         "p99": percentile(lat, 99), "max": lat[-1] if lat else None}

    heals = [float(ev["t"]) for ev in nemesis if ev.get("f") == "heal"]
    heal = heals[-1] if heals else None
    send_times = [float(ev["t"]) for ev in history if ev.get("f") == "send"]
    t0 = min(invoked.values(), default=None)
    end = heal if heal is not None else max(send_times, default=None)
    out.update(longest_gap_s=None, longest_gap=None, ack_rate_healthy=None, ack_rate_fault=None,
               fault_s=None, recovery_s=None)
    if t0 is not None and end is not None and end >= t0:
        inside = ok_times[bisect_right(ok_times, t0):bisect_left(ok_times, end)]
        points = [t0, *inside, end]
        gap, i = max((points[k + 1] - points[k], k) for k in range(len(points) - 1))
        out["longest_gap_s"] = gap
        out["longest_gap"] = {"start": points[i], "end": points[i + 1], "start_rel_s": points[i] - t0}
        windows = [(max(a, t0), min(b, end)) for a, b in _fault_windows(nemesis, end)
                   if b > t0 and a < end]
        fault_s = sum(b - a for a, b in windows)
        acked = ok_times[bisect_left(ok_times, t0):bisect_right(ok_times, end)]
        in_fault = sum(bisect_left(acked, b) - bisect_left(acked, a) for a, b in windows)
        out["fault_s"] = fault_s
        healthy_s = (end - t0) - fault_s
        out["ack_rate_fault"] = in_fault / fault_s if fault_s > 0 else None
        out["ack_rate_healthy"] = (len(acked) - in_fault) / healthy_s if healthy_s > 0 else None
    if heal is not None:
        after = [t for t, _, v in oks if invoked.get(v, -math.inf) > heal]
        out["recovery_s"] = min(after) - heal if after else None

    per_kind: dict[str, list[float | None]] = defaultdict(list)
    for ev in nemesis:
        if ev.get("f") != "start":
            continue
        t, faulted = float(ev["t"]), set(ev.get("nodes") or ())
        k = bisect_right(ok_times, t)
        while k < len(oks) and oks[k][1] in faulted:
            k += 1
        per_kind[str(ev.get("fault"))].append(oks[k][0] - t if k < len(oks) else None)
    out["time_to_next_ack_s"] = {
        kind: {"values": [x for x in xs if x is not None],
               "median": statistics.median([x for x in xs if x is not None])
               if any(x is not None for x in xs) else None,
               "never": sum(1 for x in xs if x is None)}
        for kind, xs in sorted(per_kind.items())}
    return out


def leadership(trace_events: list[dict[str, Any]]) -> dict[str, Any]:
    """Terms, elections won, leader changes and a leader timeline [(t_seconds, node, term)] from
    the nodes' ``role`` trace events (``chaos.traces.check`` owns the Raft invariants)."""
    roles = [ev for ev in trace_events if ev.get("ev") == "role"]
    leaders_of: dict[int, set[str]] = defaultdict(set)
    first_seen: dict[tuple[int, str], float] = {}
    for ev in roles:
        if ev.get("role") == "leader":
            term, node = int(ev["term"]), str(ev.get("node", "?"))
            leaders_of[term].add(node)
            t = float(ev.get("t", 0)) / 1e9
            first_seen[(term, node)] = min(t, first_seen.get((term, node), math.inf))
    timeline = sorted((t, node, term) for (term, node), t in first_seen.items())
    return {"terms": len({int(ev["term"]) for ev in roles}),
            "elections": len(first_seen),
            "leader_changes": max(0, len(first_seen) - 1),
            "max_leaders_per_term": max((len(ns) for ns in leaders_of.values()), default=0),
            "multi_leader_terms": {term: sorted(ns) for term, ns in sorted(leaders_of.items())
                                   if len(ns) > 1},
            "leader_timeline": [list(item) for item in timeline]}
