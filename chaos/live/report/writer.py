"""The report of live chaos runs (docs/testing.md): it owns how the results of L2 scenario runs
are shown, and nothing else - it runs no scenario and checks no history.

Input is what the harness hands over: a ``meta`` dict (commit, date, machine, Raft timing, the
command) and one dict per run (scenario, seed, faults, durability counters, the checker's
``CheckResult.to_dict()`` under ``"check"``, time series, verdict). The checker's dict is read
defensively: a missing key renders as "–" and a list renders as its length.

``write_report`` writes ``report.md`` (tables 1-5 and 7 of section 4.9, plus one section per run
with its timeline image and, for failed runs, the first violations), ``report.json`` (the input,
verbatim, plus a summary) and one PNG timeline per run. matplotlib is imported only when a
timeline is drawn, so importing this module stays cheap.

The parts: ``report_cells`` (how a value is shown, labels, image names, the summary),
``report_tables`` (the markdown) and ``report_timeline`` (the PNG); this module writes the files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos.live.report.cells import png_names, summarize
from chaos.live.report.tables import render_markdown
from chaos.live.report.timeline import plot_timeline

__all__ = ["plot_timeline", "png_names", "render_markdown", "summarize", "write_report"]


# ---------------------------------------------------------------------------------------------
# Files


def write_report(runs: list[dict[str, Any]], meta: dict[str, Any], out_dir: str | Path) -> Path:
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
