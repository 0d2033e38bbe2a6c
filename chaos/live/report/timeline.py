"""The timeline image of one live chaos run (``chaos.live.report.writer``): ack latency with fail/info
marks, acknowledgements per second and which node led, over seconds since the run started, with
fault windows shaded; saved as a small palette PNG. matplotlib is imported only when a timeline
is drawn, so importing this module stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from chaos.live.report.cells import Run, _leaders, _mapping, _run_label

__all__ = ["plot_timeline"]


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
    from matplotlib.artist import Artist
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    series = _mapping(run.get("series"))
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
    bins = math.ceil(t_end)
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

    handles: list[Artist] = [Patch(facecolor=kind_colour[k], alpha=0.3, label=k) for k in kinds]
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
