"""The report's "Where the efficiency went" section: the efficiency-loss split of every DDP group
(analysis.runs.efficiency, in the runs JSON as `groups[].efficiency_loss_pts`; its rows from
analysis.runs.sweep.loss_rows) as a table and a waterfall per group, from 100 % (ideal) down to
the measured efficiency. Renders only: the waterfall's bar positions are its drawing.
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import seaborn as sns

from analysis.columns import EFFICIENCY_LOSS_COLS
from analysis.report.figures import png_uri, theme
from analysis.report.scaling import group_labels
from analysis.report.tables import Table
from analysis.runs.runsjson import RunsJson
from analysis.runs.sweep import LossRow, loss_rows

__all__ = ["MAX_WATERFALLS", "PART_NAMES", "loss_context", "waterfall_figure"]

PART_NAMES = {
    "exposed_comm": "exposed comm",
    "stragglers": "waiting for the slowest rank",
    "data": "data loading",
    "ddp_overhead": "DDP's own per-step cost",
    "host_contention": "host contention (other processes)",
    "contention": "compute contention",
    "residual": "residual",
}
MAX_WATERFALLS = 6  # panels in the figure; a sweep's other groups are in the table


def _waterfall(ax: plt.Axes, label: str, row: LossRow) -> None:
    """Floating bars, top to bottom: ideal 100 %, minus each part, the measured efficiency."""
    names, lefts, widths, colors = ["ideal"], [0.0], [100.0], ["0.6"]
    level = 100.0
    red, green = sns.color_palette("deep")[3], sns.color_palette("deep")[2]
    for key, name in PART_NAMES.items():
        pts = row.parts[key]
        names.append(f"{name} (not measured)" if pts is None else name)
        pts = pts or 0.0
        lefts.append(min(level, level - pts))
        widths.append(abs(pts))
        colors.append(red if pts > 0 else green)
        level -= pts
    names.append("measured")
    lefts.append(0.0)
    widths.append(100 * row.scaling_efficiency_mean)
    colors.append(sns.color_palette("deep")[0])
    y = range(len(names))
    ax.barh(list(y), widths, left=lefts, color=colors, height=0.6)
    for i, key in enumerate(PART_NAMES, start=1):  # each step's change of efficiency, in points
        if (pts := row.parts[key]) is not None:
            ax.text(lefts[i] + widths[i], i, f" {-pts:+.1f}", va="center", fontsize=8)
    ax.set_yticks(list(y), names)
    ax.invert_yaxis()
    ax.axvline(100, color="0.5", lw=0.8, ls="--")
    eff = 100 * row.scaling_efficiency_mean
    ax.set(xlabel="scaling efficiency (%)", title=f"{label}: {eff:.0f}%")


def waterfall_figure(rows: list[tuple[str, LossRow]]) -> str | None:
    """One waterfall panel per (label, group row), the first MAX_WATERFALLS, side by side in pairs."""
    rows = rows[:MAX_WATERFALLS]
    if not rows:
        return None
    theme()
    cols = min(len(rows), 2)
    nrows = -(-len(rows) // cols)
    width = 9.0 if cols == 1 else 5.6 * cols  # one group: the page's width, not a thumbnail
    fig, axes = plt.subplots(nrows, cols, figsize=(width, 2.9 * nrows), squeeze=False)
    for ax, (label, row) in zip(axes.flat, rows, strict=False):
        _waterfall(ax, label, row)
    for ax in list(axes.flat)[len(rows) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return png_uri(fig)


def loss_context(doc: RunsJson) -> dict[str, Any]:
    """Table, figure and the number of groups the figure leaves out (analysis.runs.sweep.loss_rows:
    each group's efficiency, lost points and parts, labelled as the report labels its groups)."""
    labels = group_labels(doc)
    rows = [(labels.get((r.group.run_ids or [""])[0], ""), r) for r in loss_rows(doc)]
    table = Table(
        id="efficiency-loss",
        columns=EFFICIENCY_LOSS_COLS,
        rows=[
            {
                "group": label,
                "run_ids": r.group.run_ids,
                "scaling_efficiency_mean": r.scaling_efficiency_mean,
                "loss_pts": r.loss_pts,
                **r.parts,
            }
            for label, r in rows
        ],  # fmt: skip
        csv="efficiency_loss.csv",
    )
    return {
        "table": table,
        "figure": waterfall_figure(rows),
        "left_out": max(len(rows) - MAX_WATERFALLS, 0),
        "has_ddp1": any(r.parts["ddp_overhead"] is not None for _, r in rows),
        "has_host": any(r.parts["host_contention"] is not None for _, r in rows),
    }
