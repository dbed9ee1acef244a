"""The report's Projection section: projected scaling efficiency with its band (measured points
and replay error overlaid), bus bandwidth against message size from the comm benchmarks, and
findings. Every prediction is shown with its band ("1.7× (1.5–1.9×) at 8 ranks"), never bare.

Reads the runs JSON's `comm`, `projections` and `projection_skipped` typed, and words what
analysis.project.view decided of them (analysis/project/runs.py computes every number): a
prediction without finite numbers (damaged input) is left out of the figure and the findings
rather than failing the report. Every figure is an SVG data URI like the other sections'.
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from analysis.project.bands import band_text
from analysis.project.view import (
    FINDING_RANKS,
    LOW_EFFICIENCY,
    REPLAY_GOAL_PCT,
    SELF_REPLAY_GOAL_PCT,
    CommEntry,
    Prediction,
    ProjectionCase,
    ProjectionEntry,
    projection_case,
)
from analysis.report.axes import bytes_axis, legend_outside
from analysis.report.figures import png_uri, theme
from analysis.report.labels import Labels, unique_labels
from analysis.runs.runsjson import RunsJson

__all__ = [
    "REPLAY_GOAL_PCT",
    "SELF_REPLAY_GOAL_PCT",
    "efficiency_text",
    "projection_context",
    "speedup_text",
    "step_text",
    "table_rows",
]


def speedup_text(x: Prediction) -> str:
    """A prediction's speedup with its band and world size: "1.70× (1.52–1.88×) at 8 ranks"."""
    band = band_text(x.speedup, x.speedup_low, x.speedup_high, unit="×")
    return f"{band} at {x.ranks} rank{'s' if x.ranks != 1 else ''}"


def efficiency_text(x: Prediction) -> str:
    """A prediction's efficiency with its band in %: "85% (76–94%)"."""
    e = [100 * v for v in (x.scaling_efficiency, x.scaling_efficiency_low,
                           x.scaling_efficiency_high)]  # fmt: skip
    return band_text(*e, "{:.0f}", "%")


def step_text(x: Prediction) -> str:
    """A prediction's step time with its band in ms: "12.30 (11.02–14.10) ms"."""
    return (
        band_text(*(1e3 * v for v in (x.step_time_s, x.step_time_s_low, x.step_time_s_high)))
        + " ms"
    )


def efficiency_figure(cases: list[ProjectionCase], names: Labels) -> str | None:
    """Projected efficiency (%) vs world size per projection; measured DDP runs as points.
    `names`: run id -> the report's short label (figures never show a full run id)."""

    def _label(p: ProjectionEntry) -> str:
        return f"{names[p.run_id]} · {p.backend} (comm {names[p.comm_run_id]})"

    rows = [
        {"label": _label(c.entry), "ranks": x.ranks, "eff": 100 * x.scaling_efficiency,
         "low": 100 * x.scaling_efficiency_low, "high": 100 * x.scaling_efficiency_high}
        for c in cases
        for x in c.predictions
    ]  # fmt: skip
    if not rows:
        return None
    theme()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    palette = dict(zip(labels, sns.color_palette(n_colors=len(labels)), strict=True))
    frame = pd.DataFrame(rows)
    sns.lineplot(data=frame, x="ranks", y="eff", hue="label", palette=palette, marker="o", ax=ax)
    for label, g in frame.groupby("label", sort=False):  # the band, in the line's colour
        g = g.sort_values("ranks")
        ax.fill_between(g["ranks"], g["low"], g["high"], color=palette[label], alpha=0.18, lw=0)
    for c in cases:  # measured points in their projection's colour
        for m in c.entry.measured:
            if m.measured_scaling_efficiency is None:
                continue
            ax.scatter(
                [m.ranks],
                [100 * m.measured_scaling_efficiency],
                marker="X",
                s=90,
                zorder=5,
                color=palette[_label(c.entry)],
                label=f"measured {names[m.run_id]} (projection error {m.error_pct:+.0f}%)",
            )
    replays = [r for c in cases for r in c.entry.replays]
    if replays:
        text = "; ".join(f"{names[r.run_id]} n={r.ranks}: {r.error_pct:+.1f}%" for r in replays)
        ax.set_title(f"replay error: {text}", fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="world size (ranks, log scale)", ylabel="scaling efficiency (%)", ylim=(0, 110))
    legend_outside(ax)
    return png_uri(fig)


def _gap_note(comm: CommEntry) -> str:
    """Title suffix of a comm run from before the gap sweep, timed after compute (`--gap-ms`): its
    bandwidths are in situ."""
    if not comm.gap_ms:
        return ""
    return "\nafter " + ", ".join(f"{v:g} ms compute ({k})" for k, v in comm.gap_ms.items())


def busbw_figure(comm: list[CommEntry]) -> str | None:
    """busbw (GB/s) vs message size per collective, one panel per comm run (backend, n)."""
    ok = [c for c in comm if c.rows]
    if not ok:
        return None
    theme()
    fig, axes = plt.subplots(1, len(ok), figsize=(5.5 * len(ok), 4), squeeze=False)
    for ax, c in zip(axes[0], ok, strict=True):
        df = pd.DataFrame(c.rows).dropna(subset=["busbw_gbps"])
        df = df[df["busbw_gbps"] > 0]
        if not df.empty:
            sns.lineplot(data=df, x="bytes", y="busbw_gbps", hue="collective", marker="o", ax=ax)
            ax.set_yscale("log")
        ax.set_xscale("log", base=2)
        ax.set(
            xlabel="message size (bytes, log scale)",
            ylabel="busbw (GB/s, 1e9 B)",
            title=f"{c.backend}, n={c.world_size}" + _gap_note(c),
        )
        bytes_axis(ax.xaxis)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    legend_outside(axes[0, -1])  # the collectives' colours are the same in every panel
    fig.tight_layout()
    return png_uri(fig)


def _at_finding(c: ProjectionCase) -> list[dict]:
    p, at = c.entry, c.at
    if at is None:
        return []
    what = (
        "exposed communication (all-reduce + buffer broadcasts)"
        if c.broadcasts
        else "exposed allreduce"
    )
    text = (
        f"{p.run_id} (comm {p.comm_run_id}): at {FINDING_RANKS} ranks over "
        f"{p.inputs.inter_node_gbps:g} Gb/s between nodes, {what} would be "
        f"{at.exposed_comm_pct:.0f}% of the step (speedup {speedup_text(at)}, efficiency "
        f"{efficiency_text(at)})"
    )
    if p.fp16_exposed_comm_pct is not None:
        text += (
            f"; the fp16 comm hook halves the bytes and would bring it to "
            f"{p.fp16_exposed_comm_pct:.0f}%"
        )
    return [{"severity": "warn" if c.warn else "info", "text": text + "."}]


def _low_finding(c: ProjectionCase) -> list[dict]:
    p, low = c.entry, c.low
    if low is None:
        return []
    if c.straggler_first:
        cause = (
            f"waiting for the slowest rank ({1e3 * low.straggler_s:.1f} ms per step, from the "
            f"measured step-time spread) costs more than exposed communication "
            f"({1e3 * low.exposed_comm_s:.1f} ms)"
        )
    else:
        cause = (
            f"exposed communication ({1e3 * low.exposed_comm_s:.1f} ms per step) gives way first"
        )
    return [{
        "severity": "warn",
        "text": f"{p.run_id} (comm {p.comm_run_id}): projected efficiency drops below "
        f"{LOW_EFFICIENCY:.0%} at {low.ranks} ranks ({efficiency_text(low)}; speedup "
        f"{speedup_text(low)}): {cause}.",
    }]  # fmt: skip


def _check_findings(c: ProjectionCase) -> list[dict]:
    """One finding per replay and measured run: projected (with its band) vs measured; per
    self-replay (its own traced comm) its error, the projection's arithmetic alone."""
    out, p = [], c.entry
    for k in c.checks:
        r = k.check
        what = "replay of" if k.kind == "replay" else f"{p.run_id} projected to"
        band = band_text(*(1e3 * v for v in (r.predicted_step_time_s, r.predicted_step_time_s_low,
                                              r.predicted_step_time_s_high)))  # fmt: skip
        inside = "inside" if r.in_band else "outside"
        out.append({
            "severity": "bad" if k.bad else "good",
            "text": f"{what} {r.run_id} at n={r.ranks} (comm {p.comm_run_id}): projected "
            f"{band} ms vs measured {1e3 * r.measured_step_time_s:.2f} ms per step ({inside} "
            f"the band), error {r.error_pct:+.1f}% (goal ≤ {REPLAY_GOAL_PCT:g}%)"
            + (" — treat this projection with caution." if k.bad else "."),
        })  # fmt: skip
        if k.traced_bad is not None and r.traced is not None:
            t = r.traced
            out.append({
                "severity": "bad" if k.traced_bad else "good",
                "text": f"self-replay of {r.run_id} from its own traced per-bucket comm: "
                f"{1e3 * t.predicted_step_time_s:.2f} vs {1e3 * t.measured_step_time_s:.2f}"
                f" ms, error {t.error_pct:+.1f}% (the projection's arithmetic alone; goal ≤ "
                f"{SELF_REPLAY_GOAL_PCT:g}%).",
            })  # fmt: skip
    return out


def table_rows(c: ProjectionCase) -> list[dict]:
    """The projection table's cells per complete prediction, bands included."""
    return [
        {
            "ranks": x.ranks,
            "batch": f"{x.per_device_batch:.4g}",
            "step": step_text(x).removesuffix(" ms"),
            "compute": f"{1e3 * x.compute_s:.2f}",
            "straggler": f"{1e3 * x.straggler_s:.2f}",
            "comm": f"{1e3 * x.comm_s:.2f}",
            "exposed": f"{x.exposed_comm_pct:.1f}",
            "samples": f"{x.samples_per_s:,.1f}",
            "speedup": band_text(x.speedup, x.speedup_low, x.speedup_high),
            "efficiency": efficiency_text(x).replace("%", ""),
        }
        for x in c.predictions
    ]


def projection_context(doc: RunsJson) -> dict[str, Any]:
    """Everything the projection partial renders: figures, findings, tables, skipped inputs."""
    cases = [projection_case(p) for p in doc.projections]
    names = unique_labels(doc.runs)
    return {
        "projections": doc.projections,
        "tables": [table_rows(c) for c in cases],  # one per projection, in order
        "comm": doc.comm,
        "skipped": doc.projection_skipped,
        "findings": [
            f for c in cases for f in (*_at_finding(c), *_low_finding(c), *_check_findings(c))
        ],  # fmt: skip
        "efficiency_figure": efficiency_figure(cases, names),
        "names": names,  # run id -> short label, for the headings
        "busbw_figure": busbw_figure(doc.comm),
        "goal_pct": REPLAY_GOAL_PCT,
    }
