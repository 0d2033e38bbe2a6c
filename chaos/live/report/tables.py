"""The markdown of the live chaos report (``chaos.live.report.writer``): tables 1-5 and 7 of docs/testing.md
section 4.9 (metadata, safety, leadership, availability and latency, durability faults, the
canary matrix) and one section per run (its timeline image, fault timeline and, for failed
runs, the first violations). Text only: it writes no file and draws nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from chaos.live.report.cells import (
    DASH,
    Run,
    _cell,
    _check,
    _count,
    _faults_text,
    _is_canary,
    _leaders,
    _lost_on_replica_max,
    _mapping,
    _num,
    _pair,
    _run_label,
    _secs,
    _table,
    _verdict_text,
    png_names,
    summarize,
)

__all__ = ["HOW_TO_READ", "render_markdown"]

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

FEATURES_HOW_TO_READ = (
    "Runs with the messaging features also drive delayed sends, two orderly consumers (one of "
    "them leaving and coming back every 8 s) and a push consumer whose listener fails message "
    "*i* 0, 1, 2 times or always (max 3 reconsumes), through the same faults. Their checkers: "
    "*delay* (no message stored before its due time, none twice, none lost), *orderly* (no two "
    "members processing one queue at once, each order id in send order, none lost), *retry* "
    "(copy *k* of a message carries reconsume count *k*; *f* planned failures take *f* + 1 "
    "copies; an always-failing message is in the dead-letter queue once, after 4 copies, with "
    "count 3 and its ids kept; none lost). Redeliveries of one copy (at least once) are allowed."
)

TXN_HOW_TO_READ = (
    "The transactional workload: three producers of one producer group (one of them a process "
    "killed with SIGKILL and started again every 4-8 s) send transactional messages whose body "
    "carries the plan of their local transaction: COMMIT, ROLLBACK, raise (UNKNOWN) then "
    "COMMIT on check-back, UNKNOWN then ROLLBACK, UNKNOWN for a few check-backs then COMMIT; two "
    "push consumer groups consume them. Its checker (*txn*): no rolled-back message stored or "
    "consumed, none consumed before its COMMIT was decided, each committed one stored once and "
    "consumed by both groups (redeliveries of the stored copy allowed), none lost, and no "
    "transaction left open at the leader within the bound after the stop (transaction "
    "timeout + (max checks + 1) × check interval, and slack)."
)


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
        lat = _mapping(c.get("latency_ms"))
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
        d = _mapping(run.get("durability"))
        rows.append([
            _num(run.get("scenario")), _num(run.get("seed")), _num(run.get("flush_mode")),
            _num(run.get("canary")), _num(d.get("power_loss_events")), _num(d.get("bytes_discarded")),
            _num(d.get("corruption_events")), _num(d.get("corrupt_node_became_leader")),
            _num(_check(run).get("lost")), _verdict_text(run),
        ])
    return _table(header, rows)


def _features_table(runs: Sequence[Run]) -> list[str]:
    header = ["scenario", "seed", "canary", "delayed (acked / delivered)",
              "ordered (acked / processed / member rejoins)",
              "retried (acked / consumed / dead letters, of always failing)",
              "violations (delay / orderly / retry)", "work ended after stop", "verdict"]
    rows = []
    for run in runs:
        f = _mapping(run.get("features"))
        d, o, r = _mapping(f.get("delay")), _mapping(f.get("orderly")), _mapping(f.get("retry"))
        rows.append([
            _num(run.get("scenario")), _num(run.get("seed")), _num(run.get("canary")),
            _pair(d.get("acked"), d.get("delivered")),
            _pair(o.get("acked"), o.get("processed"), o.get("rejoins")),
            f"{_pair(r.get('acked'), r.get('consumed'), r.get('dead_letters'))}, of "
            f"{_num(r.get('always_failing'))}",
            _pair(d.get("violations"), o.get("violations"), r.get("violations")),
            _secs(f.get("finished_in_s"), 1) if f.get("finished_in_s") is not None
            else "**not within the wait**", _verdict_text(run),
        ])
    return _table(header, rows)


def _txn_table(runs: Sequence[Run]) -> list[str]:
    header = ["scenario", "seed", "canary", "sent / halves acked", "in the topic / rolled back",
              "resolved by check-back (for another producer)", "producer kills (mid-send)",
              "redeliveries", "check-max rollbacks", "none open after stop (bound)",
              "violations", "verdict"]
    rows = []
    for run in runs:
        t = _mapping(_mapping(run.get("features")).get("txn"))
        redelivered = _mapping(t.get("redeliveries"))
        resolved = t.get("resolved_in_s")
        rows.append([
            _num(run.get("scenario")), _num(run.get("seed")), _num(run.get("canary")),
            _pair(t.get("sent"), t.get("halves")), _pair(t.get("committed"), t.get("rolled_back")),
            f"{_num(t.get('resolved_by_check'))} ({_num(t.get('resolved_for_another'))})",
            f"{_num(t.get('producer_kills'))} ({_num(t.get('killed_mid_send'))})",
            _pair(*redelivered.values()) if redelivered else DASH,
            _num(t.get("check_max_rollbacks")),
            f"{_secs(resolved, 1) if resolved is not None else '**never**'} "
            f"({_secs(t.get('bound_s'), 0)})",
            _num(t.get("violations")), _verdict_text(run),
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
    featured = [r for r in runs if isinstance(r.get("features"), Mapping)]
    if featured:
        out += ["## Messaging features", "", FEATURES_HOW_TO_READ, "", *_features_table(featured),
                ""]
    with_txn = [r for r in featured if isinstance(_mapping(r.get("features")).get("txn"), Mapping)]
    if with_txn:
        out += ["### Transactional messages", "", TXN_HOW_TO_READ, "", *_txn_table(with_txn), ""]
    canaries = [r for r in runs if _is_canary(r)]
    out += ["## Canary matrix", ""]
    out += [*_canary_table(canaries), ""] if canaries else ["No canary runs.", ""]
    out += ["## Runs", ""]
    for run, png in zip(runs, png_names(runs)):
        out += _run_section(run, png)
    return "\n".join(out).rstrip() + "\n"
