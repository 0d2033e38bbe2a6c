"""The availability bound of a leader's one-way silence (issue 16 item 1, scenario S16): under a
silence of the leader, a producer sending one message at a time must get an acknowledgement
within ``first_ack_s`` of the cut and keep at least ``min_rate_ratio`` of its pre-cut ack rate
from then until the heal.

Unlike ``chaos.live.checkers.availability`` (measurements only), this owns a verdict, and only for the
scenarios that declare the bound. Pure: no I/O, no clock; bisect over the recorded history.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any

FAULT = "silence"  # the nemesis fault name of a one-way silence


@dataclass(frozen=True)
class SilenceBound:
    first_ack_s: float = 3.0  # an acknowledgement this soon after the cut
    min_rate_ratio: float = 0.5  # post-cut ack rate over pre-cut ack rate, at least
    pre_window_s: float = 5.0  # the pre-cut rate is measured over this much before the cut


def _windows(history: list[dict[str, Any]]) -> list[tuple[float, float, set[str]]]:
    """(cut, heal, silenced nodes) of every silence; one not healed runs to the last event."""
    end = max((float(ev["t"]) for ev in history), default=0.0)
    out: list[tuple[float, float, set[str]]] = []
    open_at: list[tuple[float, set[str]]] = []
    for ev in history:
        if ev.get("proc") != "nemesis" or ev.get("fault") != FAULT:
            continue
        if ev.get("f") == "start":
            open_at.append((float(ev["t"]), set(ev.get("nodes") or ())))
        elif ev.get("f") == "stop" and open_at:
            t, nodes = open_at.pop(0)
            out.append((t, float(ev["t"]), nodes))
    return out + [(t, max(t, end), nodes) for t, nodes in open_at]


def check_silence(history: list[dict[str, Any]],
                  bound: SilenceBound) -> tuple[list[dict[str, Any]], list[str]]:
    """Per silence window: first_ack_s (cut to the first ok from another node), pre_rate and
    post_rate (acks per second before the cut, and from that first ack to the heal), ratio;
    and the violation lines of the windows that break ``bound``."""
    oks = sorted((float(ev["t"]), str(ev.get("node"))) for ev in history
                 if ev.get("f") == "send" and ev.get("type") == "ok")
    times = [t for t, _ in oks]
    windows: list[dict[str, Any]] = []
    lines: list[str] = []
    for cut, heal, nodes in _windows(history):
        pre_from = max(cut - bound.pre_window_s, times[0] if times else cut)
        pre_n = bisect_left(times, cut) - bisect_left(times, pre_from)
        pre_rate = pre_n / (cut - pre_from) if cut > pre_from else None
        k = bisect_right(times, cut)
        while k < len(oks) and oks[k][1] in nodes:
            k += 1  # an answer the silenced node had sent before the cut
        first = times[k] if k < len(oks) and times[k] < heal else None
        post_rate = ratio = None
        if first is not None and heal > first:
            post_rate = (bisect_left(times, heal) - k) / (heal - first)
            ratio = post_rate / pre_rate if pre_rate else None
        w = {"nodes": sorted(nodes), "cut_s": heal - cut,
             "first_ack_s": None if first is None else round(first - cut, 3),
             "pre_rate": pre_rate, "post_rate": post_rate, "ratio": ratio}
        windows.append(w)
        lines += _judge(w, bound)
    return windows, lines


def _judge(w: dict[str, Any], bound: SilenceBound) -> list[str]:
    who = f"silence of {','.join(w['nodes'])}"
    if not w["pre_rate"]:
        return [f"silence_availability: no acks before the {who}: nothing to compare"]
    out = []
    if w["first_ack_s"] is None or w["first_ack_s"] > bound.first_ack_s:
        got = "none before the heal" if w["first_ack_s"] is None else f"after {w['first_ack_s']} s"
        out.append(f"silence_availability: first ack after the {who}: {got} "
                   f"(bound {bound.first_ack_s} s)")
    if w["ratio"] is not None and w["ratio"] < bound.min_rate_ratio:
        out.append(f"silence_availability: ack rate after the {who} {w['post_rate']:.1f}/s is "
                   f"{w['ratio']:.2f} of the {w['pre_rate']:.1f}/s before (bound "
                   f"{bound.min_rate_ratio})")
    return out
