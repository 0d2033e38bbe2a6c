"""The report of live chaos runs (CHAOS.md section 4.9): it owns how the results of L2 scenario runs
are shown, and nothing else - it runs no scenario and checks no history.

Input is what the harness hands over: a ``meta`` dict (commit, date, machine, Raft timing, the
command) and one dict per run (scenario, seed, faults, durability counters, the checker's
``CheckResult.to_dict()`` under ``"check"``, time series, verdict). The checker's dict is read
defensively: a missing key renders as "–" and a list renders as its length.

``write_report`` writes ``report.md`` (tables 1-5 and 7 of section 4.9, plus one section per run
with its timeline image and, for failed runs, the first violations), ``report.json`` (the input,
verbatim, plus a summary) and one PNG timeline per run. matplotlib is imported only when a
timeline is drawn, so importing this module stays cheap.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["write_report", "render_markdown", "plot_timeline", "png_names", "summarize"]

Run = Mapping[str, Any]

DASH = "–"
MAX_VIOLATIONS_SHOWN = 10
MAX_FAULT_WINDOWS_SHOWN = 30

HOW_TO_READ = (
    "**How to read this.** Each run drives real broker processes with a seeded fault schedule, "
    "records every client operation, heals the cluster, drains every replica and checks the history "
    "offline. **PASS** means every safety check held. The safety checks are *lost* (acknowledged "
    "but never read), *lost-on-replica* (acknowledged but missing from a replica's final committed "
    "log), *unexpected* (read but never sent, or read although its send definitely failed), "
    "*duplicates*, *inconsistent offsets* (one offset, two values), *order violations*, "
    "*max leaders per term* (must be ≤ 1) and *committed-prefix divergences*: every one of them "
    "must be 0 for a PASS. *fail* and *info* (indeterminate, e.g. a timeout) outcomes are allowed; "
    "*recovered* counts indeterminate sends that did take effect and is informational, as are "
    "retry duplicates. Canary runs run a deliberately broken build and are **expected to FAIL**: a "
    "canary that fails is a bug the checks *caught*. The leadership, availability and latency "
    "numbers are measurements of this machine and configuration, not pass/fail criteria."
)


# ---------------------------------------------------------------------------------------------
# Value helpers


def _check(run: Run) -> Mapping[str, Any]:
    check = run.get("check")
    return check if isinstance(check, Mapping) else {}


def _count(value: Any) -> Any:
    """A count from a checker value: lists, sets and dicts count their items; None stays None."""
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return len(value)
    return value


def _num(value: Any, digits: int = 2) -> str:
    """One cell: "–" for missing, ints as ints, floats rounded, lists as their length."""
    value = _count(value)
    if value is None:
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return DASH
        if math.isinf(value):
            return "∞"
        if value.is_integer() and abs(value) >= 100:
            return str(int(value))
        return f"{value:.{digits}f}"
    return _cell(str(value))


def _secs(value: Any, digits: int = 1) -> str:
    text = _num(value, digits)
    return text if text in (DASH, "∞") else f"{text} s"


def _cell(text: str) -> str:
    """Text made safe for a markdown table cell."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").strip()


def _pair(*values: Any, sep: str = " / ") -> str:
    cells = [_num(v) for v in values]
    return DASH if all(c == DASH for c in cells) else sep.join(cells)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _faults_text(faults: Any) -> str:
    if not isinstance(faults, Mapping):
        return DASH if faults is None else _num(faults)
    parts = [f"{_cell(str(kind))}×{_num(n)}" for kind, n in faults.items() if _count(n)]
    return ", ".join(parts) if parts else "none"


def _lost_on_replica_max(check: Mapping[str, Any]) -> Any:
    if check.get("lost_on_replica_max") is not None:
        return check.get("lost_on_replica_max")
    per_node = check.get("lost_on_replica")
    if isinstance(per_node, Mapping):
        counts = [c for c in (_count(v) for v in per_node.values()) if isinstance(c, (int, float))]
        return max(counts) if counts else 0
    return per_node


def _is_canary(run: Run) -> bool:
    return bool(run.get("canary")) or run.get("expect") == "fail"


def _expected(run: Run) -> str:
    expect = run.get("expect")
    if expect in ("pass", "fail"):
        return str(expect).upper()
    return "FAIL" if run.get("canary") else "PASS"


def _as_expected(run: Run) -> bool:
    return str(run.get("verdict", "")).upper() == _expected(run)


def _verdict_text(run: Run) -> str:
    verdict = str(run.get("verdict") or DASH).upper()
    if _expected(run) == "FAIL":
        if verdict == "FAIL":
            return "FAIL (expected) – caught"
        return f"**{_cell(verdict)} (expected FAIL) – NOT caught**"
    if verdict == "PASS":
        return "PASS"
    return f"**{_cell(verdict)}**"


def _run_label(run: Run) -> str:
    label = f"{run.get('scenario', '?')} {run.get('title', '')}".strip()
    label += f" — seed {run.get('seed', '?')} — {str(run.get('verdict') or DASH).upper()}"
    if run.get("canary"):
        label += f" (canary {run.get('canary')}, expected {_expected(run)})"
    return label


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "run"


def png_names(runs: Sequence[Run]) -> list[str]:
    """The image file name of each run: ``<scenario>-seed<seed>.png``; a canary run gets its canary
    appended (it often shares scenario and seed with a normal run), and any remaining clash a
    counter, so no run overwrites another's image."""
    names: list[str] = []
    seen: set[str] = set()
    for run in runs:
        stem = f"{_slug(str(run.get('scenario', 'run')))}-seed{_slug(str(run.get('seed', 'x')))}"
        if run.get("canary"):
            stem += f"-{_slug(str(run.get('canary')))}"
        name, n = f"{stem}.png", 2
        while name in seen:
            name, n = f"{stem}-{n}.png", n + 1
        seen.add(name)
        names.append(name)
    return names


def summarize(runs: Sequence[Run]) -> dict[str, Any]:
    """Counts for the top of the report: verdicts, and how many runs ended as expected."""
    verdicts = [str(r.get("verdict", "")).upper() for r in runs]
    canaries = [r for r in runs if _is_canary(r)]
    return {
        "runs": len(runs),
        "pass": verdicts.count("PASS"),
        "fail": verdicts.count("FAIL"),
        "as_expected": sum(1 for r in runs if _as_expected(r)),
        "unexpected": [f"{r.get('scenario')}/seed{r.get('seed')}" for r in runs if not _as_expected(r)],
        "canaries": len(canaries),
        "canaries_caught": sum(1 for r in canaries if str(r.get("verdict", "")).upper() == "FAIL"),
    }


# ---------------------------------------------------------------------------------------------
# Markdown


def _meta_table(runs: Sequence[Run], meta: Mapping[str, Any]) -> list[str]:
    def distinct(key: str) -> str:
        values = sorted({str(r.get(key)) for r in runs if r.get(key) is not None})
        return ", ".join(values) if values else DASH

    seeds = sorted({str(r.get("seed")) for r in runs if r.get("seed") is not None},
                   key=lambda s: (not s.isdigit(), int(s) if s.isdigit() else 0, s))
    timeout = meta.get("election_timeout_ms")
    if isinstance(timeout, (list, tuple)) and len(timeout) == 2:
        timeout_text = f"{_num(timeout[0])}–{_num(timeout[1])} ms"
    else:
        timeout_text = _num(timeout)
    tick = meta.get("tick_ms")
    ticks = meta.get("election_ticks")
    rows = [
        ("commit", _num(meta.get("commit"))),
        ("date", _num(meta.get("date"))),
        ("python", _num(meta.get("python"))),
        ("kernel", _num(meta.get("kernel"))),
        ("cores", _num(meta.get("cores"))),
        ("tick", f"{_num(tick)} ms" if tick is not None else DASH),
        ("election ticks", _num(ticks)),
        ("heartbeat", f"{_num(meta.get('heartbeat_ms'))} ms" if meta.get("heartbeat_ms") is not None
         else DASH),
        ("election timeout", timeout_text),
        ("flush (fsync) modes", distinct("flush_mode")),
        ("group sizes", distinct("nodes")),
        ("scenarios", distinct("scenario")),
        ("seeds", ", ".join(seeds) if seeds else DASH),
        ("canaries", distinct("canary")),
        ("runs", str(len(runs))),
        ("command", f"`{meta['command']}`" if meta.get("command") else DASH),
    ]
    return _table(["key", "value"], [(k, v) for k, v in rows])


def _safety_table(runs: Sequence[Run]) -> list[str]:
    header = ["scenario", "title", "seed", "nodes", "flush", "canary", "duration", "faults",
              "attempted", "ok", "fail", "info", "lost", "lost-on-replica (max)", "unexpected",
              "failed but read", "recovered", "dups (protocol / retry)", "inconsistent offsets",
              "order violations (producer / real-time / consumer)", "stale reads",
              "max leaders/term", "prefix divergences", "trace problems", "verdict"]
    rows = []
    for run in runs:
        c = _check(run)
        rows.append([
            _num(run.get("scenario")), _num(run.get("title")), _num(run.get("seed")),
            _num(run.get("nodes")), _num(run.get("flush_mode")), _num(run.get("canary")),
            _secs(run.get("duration_s"), 0), _faults_text(run.get("faults")),
            _num(c.get("attempted")), _num(c.get("ok")), _num(c.get("fail")), _num(c.get("info")),
            _num(c.get("lost")), _num(_lost_on_replica_max(c)), _num(c.get("unexpected")),
            _num(c.get("failed_but_read")), _num(c.get("recovered")),
            _pair(c.get("duplicates_protocol"), c.get("duplicates_retry")),
            _num(c.get("inconsistent_offsets")),
            _pair(c.get("order_producer"), c.get("order_realtime"), c.get("order_consumer")),
            _num(c.get("stale_reads")), _num(c.get("max_leaders_per_term")),
            _num(c.get("replica_divergences")), _num(c.get("trace_problems")), _verdict_text(run),
        ])
    return _table(header, rows)


def _leaders(run: Run) -> list[tuple[float, str, Any]]:
    series = run.get("series") if isinstance(run.get("series"), Mapping) else {}
    out = []
    for item in series.get("leaders") or []:
        if isinstance(item, (list, tuple)) and len(item) >= 2 and isinstance(item[0], (int, float)):
            out.append((float(item[0]), str(item[1]), item[2] if len(item) > 2 else None))
    out.sort(key=lambda e: e[0])
    return out


def _leadership_table(runs: Sequence[Run]) -> list[str]:
    header = ["scenario", "seed", "terms", "elections", "leader changes", "leader changes/min",
              "longest leaderless window", "max election duration", "max leaders/term",
              "redirect hops (mean / max)"]
    rows = []
    for run in runs:
        c = _check(run)
        leaders = _leaders(run)
        elections = c.get("elections")
        if elections is None and isinstance(run.get("series"), Mapping) \
                and "leaders" in run["series"]:
            elections = len(leaders)
        changes = _count(c.get("leader_changes"))
        duration = run.get("duration_s")
        per_min = (changes * 60.0 / duration if isinstance(changes, (int, float))
                   and isinstance(duration, (int, float)) and duration > 0 else None)
        rows.append([
            _num(run.get("scenario")), _num(run.get("seed")), _num(c.get("terms")), _num(elections),
            _num(changes), _num(per_min), _secs(c.get("longest_leaderless_s"), 2),
            _secs(c.get("max_election_s"), 2), _num(c.get("max_leaders_per_term")),
            _pair(c.get("redirect_hops_mean"), c.get("redirect_hops_max")),
        ])
    return _table(header, rows)


def _next_ack_text(value: Any) -> str:
    if value is None or (isinstance(value, Mapping) and not value):
        return DASH
    if not isinstance(value, Mapping):
        return _secs(value, 2)
    parts = []
    for kind, stats in value.items():
        if isinstance(stats, Mapping):
            median, n = stats.get("median"), _count(stats.get("values"))
            text = f"{_cell(str(kind))} {_secs(median, 2)}"
            if isinstance(n, int):
                text += f" (n={n})"
        else:
            text = f"{_cell(str(kind))} {_secs(stats, 2)}"
        parts.append(text)
    return ", ".join(parts)


def _percent(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
        return f"{100.0 * value:.1f} %"
    return _num(value)


def _availability_table(runs: Sequence[Run]) -> list[str]:
    header = ["scenario", "seed", "ack rate healthy / under fault (msg/s)", "p50 / p95 / p99 (ms)",
              "longest window without ack", "recovery after heal", "time to next ack after fault "
              "(median)", "info share"]
    rows = []
    for run in runs:
        c = _check(run)
        lat = c.get("latency_ms") if isinstance(c.get("latency_ms"), Mapping) else {}
        rows.append([
            _num(run.get("scenario")), _num(run.get("seed")),
            _pair(c.get("ack_rate_healthy"), c.get("ack_rate_fault")),
            _pair(lat.get("p50"), lat.get("p95"), lat.get("p99"), sep=" / "),
            _secs(c.get("longest_gap_s"), 2), _secs(c.get("recovery_s"), 2),
            _next_ack_text(c.get("time_to_next_ack_s")), _percent(c.get("info_share")),
        ])
    return _table(header, rows)


def _durability_table(runs: Sequence[Run]) -> list[str]:
    header = ["scenario", "seed", "flush", "canary", "power-loss events", "bytes discarded",
              "corruption events", "corrupt node became leader", "lost", "verdict"]
    rows = []
    for run in runs:
        d = run.get("durability") if isinstance(run.get("durability"), Mapping) else {}
        rows.append([
            _num(run.get("scenario")), _num(run.get("seed")), _num(run.get("flush_mode")),
            _num(run.get("canary")), _num(d.get("power_loss_events")), _num(d.get("bytes_discarded")),
            _num(d.get("corruption_events")), _num(d.get("corrupt_node_became_leader")),
            _num(_check(run).get("lost")), _verdict_text(run),
        ])
    return _table(header, rows)


def _canary_table(runs: Sequence[Run]) -> list[str]:
    header = ["seeded bug", "detector (first violation)", "scenario / seed", "time to detect",
              "caught"]
    rows = []
    for run in runs:
        violations = run.get("violations") or []
        first = _cell(str(violations[0])) if violations else DASH
        if len(first) > 160:
            first = first[:157] + "…"
        caught = str(run.get("verdict", "")).upper() == "FAIL"
        rows.append([
            f"`{_cell(str(run.get('canary') or DASH))}`", first,
            f"{_num(run.get('scenario'))} / {_num(run.get('seed'))}",
            _secs(run.get("time_to_detect_s", _check(run).get("time_to_detect_s")), 1),
            "yes" if caught else "**NO**",
        ])
    return _table(header, rows)


def _run_section(run: Run, png: str) -> list[str]:
    lines = [f"### {_cell(_run_label(run))}", ""]
    facts = [f"nodes {_num(run.get('nodes'))}", f"flush {_num(run.get('flush_mode'))}",
             f"duration {_secs(run.get('duration_s'), 0)}", f"wall {_secs(run.get('wall_s'), 1)}",
             f"faults: {_faults_text(run.get('faults'))}"]
    lines += ["; ".join(facts), "", f"![{_cell(_run_label(run))}]({png})", ""]
    per_node = _check(run).get("lost_on_replica")
    if isinstance(per_node, Mapping) and any(_count(v) for v in per_node.values()):
        lines += ["Lost on replica: " + ", ".join(f"{_cell(str(n))} {_num(v)}"
                                                  for n, v in sorted(per_node.items())), ""]
    windows = [w for w in run.get("fault_windows") or [] if isinstance(w, Mapping)]
    if windows:
        lines += ["<details><summary>Fault timeline "
                  f"({len(windows)} window{'s' if len(windows) != 1 else ''})</summary>", "", "```text"]
        for w in windows[:MAX_FAULT_WINDOWS_SHOWN]:
            nodes = w.get("nodes")
            nodes_text = ",".join(str(n) for n in nodes) if isinstance(nodes, (list, tuple)) else str(nodes)
            lines.append(f"{_secs(w.get('start'), 1):>9} – {_secs(w.get('stop'), 1):>9}  "
                         f"{w.get('fault', '?')} {nodes_text}")
        if len(windows) > MAX_FAULT_WINDOWS_SHOWN:
            lines.append(f"… and {len(windows) - MAX_FAULT_WINDOWS_SHOWN} more")
        lines += ["```", "", "</details>", ""]
    if str(run.get("verdict", "")).upper() != "PASS":
        violations = [str(v) for v in run.get("violations") or []]
        shown = min(len(violations), MAX_VIOLATIONS_SHOWN)
        lines.append(f"Violations (first {shown} of {len(violations)}):" if violations
                     else "Violations: (no violation text recorded)")
        if violations:
            lines += ["", "```text", *violations[:MAX_VIOLATIONS_SHOWN], "```"]
        lines.append("")
    notes = [str(n) for n in run.get("notes") or []]
    if notes:
        lines += ["Notes:", "", *[f"- {n}" for n in notes], ""]
    return lines


def render_markdown(runs: Sequence[Run], meta: Mapping[str, Any]) -> str:
    """The whole report.md text for ``runs`` (in the order given) and ``meta``."""
    s = summarize(runs)
    status = ("all runs ended as expected" if not s["unexpected"]
              else f"**{len(s['unexpected'])} run(s) did not end as expected: "
                   + ", ".join(s["unexpected"]) + "**")
    out = ["# Live chaos report", "", HOW_TO_READ, "",
           f"{s['runs']} run(s): {s['pass']} PASS, {s['fail']} FAIL; canaries caught "
           f"{s['canaries_caught']}/{s['canaries']}; {status}.", ""]
    out += ["## Run metadata", "", *_meta_table(runs, meta), ""]
    out += ["## Safety", "", *_safety_table(runs), ""]
    out += ["## Leadership", "", *_leadership_table(runs), ""]
    out += ["## Availability and latency", "",
            "Measurements, not pass/fail criteria.", "", *_availability_table(runs), ""]
    out += ["## Durability faults", "", *_durability_table(runs), ""]
    canaries = [r for r in runs if _is_canary(r)]
    out += ["## Canary matrix", ""]
    out += [*_canary_table(canaries), ""] if canaries else ["No canary runs.", ""]
    out += ["## Runs", ""]
    for run, png in zip(runs, png_names(runs)):
        out += _run_section(run, png)
    return "\n".join(out).rstrip() + "\n"


# ---------------------------------------------------------------------------------------------
# Timeline plot


def _points(items: Any, width: int) -> list[tuple[Any, ...]]:
    out = []
    for item in items or []:
        if isinstance(item, (list, tuple)) and len(item) >= width \
                and isinstance(item[0], (int, float)) and not isinstance(item[0], bool):
            out.append(tuple(item))
    return out


def plot_timeline(run: Run, path: str | Path) -> None:
    """Draw one run's timeline to the PNG ``path``: ack latency with fail/info marks, acks per
    second, and which node led, over seconds since the run started, with fault windows shaded."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    series = run.get("series") if isinstance(run.get("series"), Mapping) else {}
    acks = [(float(t), float(ms)) for t, ms, *_ in _points(series.get("acks"), 2)
            if isinstance(ms, (int, float))]
    fails = [(float(t), str(kind)) for t, kind, *_ in _points(series.get("fails"), 2)]
    leaders = _leaders(run)
    windows = []
    for w in run.get("fault_windows") or []:
        if isinstance(w, Mapping) and isinstance(w.get("start"), (int, float)):
            windows.append((str(w.get("fault", "fault")), float(w["start"]),
                            float(w["stop"]) if isinstance(w.get("stop"), (int, float)) else None))

    ends = [0.0] + [t for t, _ in acks] + [t for t, _ in fails] + [t for t, *_ in leaders]
    ends += [s for _, s, _ in windows] + [e for *_, e in windows if e is not None]
    duration = run.get("duration_s")
    if isinstance(duration, (int, float)) and not isinstance(duration, bool):
        ends.append(float(duration))
    t_end = max(max(ends), 1.0)

    fig = Figure(figsize=(10, 7), dpi=80)
    canvas = FigureCanvasAgg(fig)
    axes = fig.subplots(3, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2, 2]})
    ax_lat, ax_rate, ax_lead = axes

    palette = ["#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
               "#7f7f7f"]
    kinds = sorted({k for k, _, _ in windows})
    kind_colour = {k: palette[i % len(palette)] for i, k in enumerate(kinds)}
    for ax in axes:
        for kind, start, stop in windows:
            ax.axvspan(start, t_end if stop is None else stop, color=kind_colour[kind], alpha=0.15,
                       linewidth=0)
        ax.grid(True, axis="x", alpha=0.3)

    # (1) ack latency, with fail/info marks along the bottom edge
    if acks:
        ax_lat.scatter([t for t, _ in acks], [max(ms, 0.01) for _, ms in acks], s=3, alpha=0.5,
                       color="#1f77b4", linewidths=0)
        if any(ms > 0 for _, ms in acks):
            ax_lat.set_yscale("log")
    else:
        ax_lat.text(0.5, 0.5, "no acknowledged sends", transform=ax_lat.transAxes, ha="center",
                    va="center", color="gray")
    marks = {"fail": ("x", "#d62728", 0.04), "info": ("|", "#ff7f0e", 0.10)}
    trans = ax_lat.get_xaxis_transform()
    for kind, (marker, colour, y) in marks.items():
        ts = [t for t, k in fails if k == kind]
        if ts:
            ax_lat.plot(ts, [y] * len(ts), linestyle="none", marker=marker, color=colour,
                        markersize=5, alpha=0.7, transform=trans)
    other = [t for t, k in fails if k not in marks]
    if other:
        ax_lat.plot(other, [0.16] * len(other), linestyle="none", marker=".", color="black",
                    markersize=4, transform=trans)
    ax_lat.set_ylabel("ack latency (ms)")

    # (2) acknowledgements per second
    bins = int(math.ceil(t_end))
    counts = [0] * (bins + 1)
    for t, _ in acks:
        if t >= 0:
            counts[min(int(t), bins)] += 1
    ax_rate.step(range(bins + 1), counts, where="post", color="#2ca02c", linewidth=1)
    ax_rate.fill_between(range(bins + 1), counts, step="post", color="#2ca02c", alpha=0.25,
                         linewidth=0)
    ax_rate.set_ylabel("acks / s")
    ax_rate.set_ylim(bottom=0)

    # (3) the last elected leader, one strip per node, labelled with its term
    nodes = sorted({n for _, n, _ in leaders})
    node_row = {n: i for i, n in enumerate(nodes)}
    node_palette = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#bcbd22", "#e377c2"]
    min_label_width = t_end / 60.0
    for i, (t, node, term) in enumerate(leaders):
        stop = leaders[i + 1][0] if i + 1 < len(leaders) else t_end
        row = node_row[node]
        ax_lead.broken_barh([(t, max(stop - t, t_end / 1000.0))], (row - 0.35, 0.7),
                            facecolors=node_palette[row % len(node_palette)], alpha=0.8)
        if term is not None and stop - t >= min_label_width:
            ax_lead.text(t + (stop - t) / 2, row, str(term), ha="center", va="center", fontsize=7,
                         color="white", clip_on=True)
    if nodes:
        ax_lead.set_yticks(range(len(nodes)))
        ax_lead.set_yticklabels(nodes)
        ax_lead.set_ylim(-0.6, len(nodes) - 0.4)
    else:
        ax_lead.set_yticks([])
        ax_lead.text(0.5, 0.5, "no leader elections recorded", transform=ax_lead.transAxes,
                     ha="center", va="center", color="gray")
    ax_lead.set_ylabel("leader (term)")
    ax_lead.set_xlabel("seconds since run start")
    ax_lead.set_xlim(0, t_end)

    handles = [Patch(facecolor=kind_colour[k], alpha=0.3, label=k) for k in kinds]
    handles += [Line2D([], [], linestyle="none", marker=m, color=c, label=k)
                for k, (m, c, _) in marks.items() if any(fk == k for _, fk in fails)]
    if handles:
        ax_lat.legend(handles=handles, loc="upper right", fontsize=8, framealpha=0.8,
                      ncol=min(len(handles), 4))
    fig.suptitle(_run_label(run), fontsize=11)
    fig.tight_layout()
    _save_small_png(fig, canvas, Path(path))


def _save_small_png(fig: Any, canvas: Any, path: Path) -> None:
    """Save as a 128-colour palette PNG: a dense scatter in full colour compresses badly (~130 KB
    for 12,000 acks), the palette version is ~3x smaller and looks the same."""
    try:
        from PIL import Image
    except ImportError:  # Pillow is a matplotlib dependency; stay correct without it anyway
        fig.savefig(str(path), format="png", dpi=80)
        return
    canvas.draw()
    image = Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba(), "raw",
                             "RGBA", 0, 1).convert("RGB")
    image.quantize(colors=128).save(path, format="PNG", optimize=True)


# ---------------------------------------------------------------------------------------------
# Files


def write_report(runs: list[dict], meta: dict, out_dir: str | Path) -> Path:
    """Write ``report.md``, ``report.json`` and one timeline PNG per run into ``out_dir`` (made if
    missing); return the path of ``report.md``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = png_names(runs)
    for run, name in zip(runs, names):
        plot_timeline(run, out / name)
    # the raw per-send series are drawn in the PNGs; each run's history.jsonl keeps them all
    slim = [{k: v for k, v in r.items() if k != "series"} for r in runs]
    doc = {"meta": meta, "summary": summarize(runs), "images": names, "runs": slim}
    (out / "report.json").write_text(json.dumps(doc, indent=1, default=str) + "\n",
                                     encoding="utf-8")
    md = out / "report.md"
    md.write_text(render_markdown(runs, meta), encoding="utf-8")
    return md
