"""The cells of the live chaos report (``chaos.live.report.writer``): how one value of a run is shown,
read defensively from the harness's dicts (a missing key renders as "–", a list as its length),
plus what the tables and the timeline share: run labels, verdict text, image names and the
summary counts. Nothing here writes a file or draws.

The helpers keep their leading underscores: they are the report's internals, used by
``report_tables`` and ``report_timeline`` only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["DASH", "Run", "png_names", "summarize"]

Run = Mapping[str, Any]

DASH = "–"


def _mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else an empty one (a report field missing or malformed)."""
    return value if isinstance(value, Mapping) else {}


def _check(run: Run) -> Mapping[str, Any]:
    return _mapping(run.get("check"))


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


def _leaders(run: Run) -> list[tuple[float, str, Any]]:
    series = _mapping(run.get("series"))
    out = []
    for item in series.get("leaders") or []:
        if isinstance(item, (list, tuple)) and len(item) >= 2 and isinstance(item[0], (int, float)):
            out.append((float(item[0]), str(item[1]), item[2] if len(item) > 2 else None))
    out.sort(key=lambda e: e[0])
    return out
