"""What a live run's report records beside the verdicts, read from its history and the nodes'
traces: the fault windows, the acknowledgement and leader series (the report's timeline), and
whether a node whose disk was damaged became leader before it could have caught up."""

from __future__ import annotations

from typing import Any

__all__ = ["corrupt_led", "fault_windows", "series"]


def fault_windows(events: list[dict[str, Any]], t0: float) -> list[dict[str, Any]]:
    open_: dict[tuple[str, tuple[str, ...]], list[dict[str, Any]]] = {}
    out: list[dict[str, Any]] = []
    for e in events:
        if e.get("proc") != "nemesis" or e.get("f") not in ("start", "stop"):
            continue
        key = (e["fault"], tuple(e.get("nodes", ())))
        if e["f"] == "start":
            w = {"fault": e["fault"], "nodes": list(key[1]), "start": e["t"] - t0, "stop": None}
            open_.setdefault(key, []).append(w)
            out.append(w)
        elif open_.get(key):
            open_[key].pop(0)["stop"] = e["t"] - t0
    return out


def series(events: list[dict[str, Any]], trace_events: list[dict[str, Any]],
           t0: float) -> dict[str, list[Any]]:
    invoked = {e["value"]: e["t"] for e in events if e.get("f") == "send" and e["type"] == "invoke"}
    acks = [[round(e["t"] - t0, 3), round((e["t"] - invoked[e["value"]]) * 1000, 2)]
            for e in events if e.get("f") == "send" and e["type"] == "ok" and e["value"] in invoked]
    fails = [[round(e["t"] - t0, 3), e["type"]] for e in events
             if e.get("f") == "send" and e["type"] in ("fail", "info")]
    leaders = sorted([round(int(e["t"]) / 1e9 - t0, 3), e["node"], int(e["term"])]
                     for e in trace_events if e.get("ev") == "role" and e.get("role") == "leader")
    return {"acks": acks, "fails": fails, "leaders": leaders}


def corrupt_led(corrupted: list[dict[str, Any]], trace_events: list[dict[str, Any]]) -> bool:
    """Whether a node became leader within 5 s of having its disk damaged (before it could
    have caught up from a healthy leader)."""
    for c in corrupted:
        for e in trace_events:
            if (e.get("ev") == "role" and e.get("role") == "leader" and e.get("node") == c["node"]
                    and 0 <= int(e["t"]) / 1e9 - c["t"] < 5):
                return True
    return False
