"""The report's "Where the efficiency went" section: the efficiency-loss split of every DDP group
(analysis.runs.efficiency, in the runs JSON as `groups[].efficiency_loss_pts`) as a table and a
waterfall per group, from 100 % (ideal) down to the measured efficiency. Renders only.
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import seaborn as sns

from analysis.columns import EFFICIENCY_LOSS_COLS
from analysis.report.figures import png_uri, theme
from analysis.report.scaling import group_labels
from analysis.report.tables import Table

__all__ = ["MAX_WATERFALLS", "PART_NAMES", "largest_part", "loss_context", "loss_rows"]

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


def loss_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per group with a split: its label, efficiency, lost points and the parts."""
    labels = group_labels(data)
    rows = []
    for g in data.get("groups", []):
        parts = g.get("efficiency_loss_pts")
        if not parts or g.get("scaling_efficiency_mean") is None:
            continue
        rows.append(
            {
                "group": labels.get((g.get("run_ids") or [""])[0], ""),
                "run_ids": g.get("run_ids") or [],
                "scaling_efficiency_mean": g["scaling_efficiency_mean"],
                "loss_pts": 100 * (1 - g["scaling_efficiency_mean"]),
                **parts,
            }
        )
    return rows


def largest_part(parts: dict[str, float | None]) -> tuple[str, float] | None:
    """The named part (residual excluded) that cost the most points; None when none cost any."""
    named = [(k, v) for k, v in parts.items() if k != "residual" and v is not None and v > 0]
    return max(named, key=lambda kv: kv[1]) if named else None


def _waterfall(ax: plt.Axes, row: dict[str, Any]) -> None:
    """Floating bars, top to bottom: ideal 100 %, minus each part, the measured efficiency."""
    names, lefts, widths, colors = ["ideal"], [0.0], [100.0], ["0.6"]
    level = 100.0
    red, green = sns.color_palette("deep")[3], sns.color_palette("deep")[2]
    for key, name in PART_NAMES.items():
        pts = row.get(key)
        names.append(f"{name} (not measured)" if pts is None else name)
        pts = pts or 0.0
        lefts.append(min(level, level - pts))
        widths.append(abs(pts))
        colors.append(red if pts > 0 else green)
        level -= pts
    names.append("measured")
    lefts.append(0.0)
    widths.append(100 * row["scaling_efficiency_mean"])
    colors.append(sns.color_palette("deep")[0])
    y = range(len(names))
    ax.barh(list(y), widths, left=lefts, color=colors, height=0.6)
    for i, key in enumerate(PART_NAMES, start=1):  # each step's change of efficiency, in points
        if row.get(key) is not None:
            ax.text(lefts[i] + widths[i], i, f" {-row[key]:+.1f}", va="center", fontsize=8)
    ax.set_yticks(list(y), names)
    ax.invert_yaxis()
    ax.axvline(100, color="0.5", lw=0.8, ls="--")
    eff = 100 * row["scaling_efficiency_mean"]
    ax.set(xlabel="scaling efficiency (%)", title=f"{row['group']}: {eff:.0f}%")


def waterfall_figure(rows: list[dict[str, Any]]) -> str | None:
    """One waterfall panel per group (the first MAX_WATERFALLS), side by side in pairs."""
    rows = rows[:MAX_WATERFALLS]
    if not rows:
        return None
    theme()
    cols = min(len(rows), 2)
    nrows = -(-len(rows) // cols)
    width = 9.0 if cols == 1 else 5.6 * cols  # one group: the page's width, not a thumbnail
    fig, axes = plt.subplots(nrows, cols, figsize=(width, 2.9 * nrows), squeeze=False)
    for ax, row in zip(axes.flat, rows, strict=False):
        _waterfall(ax, row)
    for ax in list(axes.flat)[len(rows) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return png_uri(fig)


def loss_context(data: dict[str, Any]) -> dict[str, Any]:
    """Table, figure and the number of groups the figure leaves out."""
    rows = loss_rows(data)
    table = Table(
        id="efficiency-loss", columns=EFFICIENCY_LOSS_COLS, rows=rows, csv="efficiency_loss.csv"
    )
    return {
        "table": table,
        "figure": waterfall_figure(rows),
        "left_out": max(len(rows) - MAX_WATERFALLS, 0),
        "has_ddp1": any(r.get("ddp_overhead") is not None for r in rows),
        "has_host": any(r.get("host_contention") is not None for r in rows),
    }
