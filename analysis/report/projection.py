"""The report's Projection section: projected scaling efficiency (measured points and replay error
overlaid), bus bandwidth against message size from the comm benchmarks, and findings.

Reads only the runs JSON (`comm`, `projections`, `projection_skipped`; see
analysis/project/runs.py). Every figure is an SVG data URI like the other sections'.
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from analysis.project.runs import FINDING_RANKS
from analysis.report.axes import bytes_axis, legend_outside
from analysis.report.figures import png_uri, theme
from analysis.report.tables import unique_labels

__all__ = ["REPLAY_GOAL_PCT", "projection_context"]

REPLAY_GOAL_PCT = 10.0  # the target for replay and measured errors


def efficiency_figure(projections: list[dict], names: dict[str, str]) -> str | None:
    """Projected efficiency (%) vs world size per projection; measured DDP runs as points.
    `names`: run id -> the report's short label (figures never show a full run id)."""

    def _label(p: dict) -> str:
        comm = p["comm_run_id"]
        return (
            f"{names.get(p['run_id'], p['run_id'])} · {p['backend']} (comm {names.get(comm, comm)})"
        )

    rows = [
        {"label": _label(p), "ranks": x["ranks"], "eff": 100 * x["scaling_efficiency"]}
        for p in projections
        for x in p["predictions"]
    ]
    if not rows:
        return None
    theme()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    palette = dict(zip(labels, sns.color_palette(n_colors=len(labels)), strict=True))
    sns.lineplot(
        data=pd.DataFrame(rows), x="ranks", y="eff", hue="label", palette=palette, marker="o", ax=ax
    )
    for p in projections:  # measured points in their projection's colour
        for m in p["measured"]:
            ax.scatter(
                [m["ranks"]],
                [100 * m["measured_scaling_efficiency"]],
                marker="X",
                s=90,
                zorder=5,
                color=palette[_label(p)],
                label=f"measured {names.get(m['run_id'], m['run_id'])} "
                f"(projection error {m['error_pct']:+.0f}%)",
            )
    replays = [r for p in projections for r in p.get("replays", [])]
    if replays:
        text = "; ".join(
            f"{names.get(r['run_id'], r['run_id'])} n={r['ranks']}: {r['error_pct']:+.1f}%"
            for r in replays
        )
        ax.set_title(f"replay error: {text}", fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="world size (ranks, log scale)", ylabel="scaling efficiency (%)", ylim=(0, 110))
    legend_outside(ax)
    return png_uri(fig)


def _gap_note(comm: dict) -> str:
    """Title suffix of a comm run from before the gap sweep, timed after compute (`--gap-ms`): its
    bandwidths are in situ."""
    gaps = comm.get("gap_ms") or {}
    if not gaps:
        return ""
    return "\nafter " + ", ".join(f"{v:g} ms compute ({k})" for k, v in gaps.items())


def busbw_figure(comm: list[dict]) -> str | None:
    """busbw (GB/s) vs message size per collective, one panel per comm run (backend, n)."""
    ok = [c for c in comm if c["rows"]]
    if not ok:
        return None
    theme()
    fig, axes = plt.subplots(1, len(ok), figsize=(5.5 * len(ok), 4), squeeze=False)
    for ax, c in zip(axes[0], ok, strict=True):
        df = pd.DataFrame(c["rows"]).dropna(subset=["busbw_gbps"])
        df = df[df["busbw_gbps"] > 0]
        if not df.empty:
            sns.lineplot(data=df, x="bytes", y="busbw_gbps", hue="collective", marker="o", ax=ax)
            ax.set_yscale("log")
        ax.set_xscale("log", base=2)
        ax.set(
            xlabel="message size (bytes, log scale)",
            ylabel="busbw (GB/s, 1e9 B)",
            title=f"{c['backend']}, n={c['world_size']}" + _gap_note(c),
        )
        bytes_axis(ax.xaxis)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    legend_outside(axes[0, -1])  # the collectives' colours are the same in every panel
    fig.tight_layout()
    return png_uri(fig)


def _findings(projections: list[dict]) -> list[dict]:
    out = []
    for p in projections:
        at = next((x for x in p["predictions"] if x["ranks"] == FINDING_RANKS), None)
        gbps = p["inputs"]["inter_node_gbps"]
        if at is not None:
            what = (
                "exposed communication (all-reduce + buffer broadcasts)"
                if at.get("buffer_broadcast_s")
                else "exposed allreduce"
            )
            text = (
                f"{p['run_id']} (comm {p['comm_run_id']}): at {FINDING_RANKS} ranks over {gbps:g} Gb/s between nodes, "
                f"{what} would be {at['exposed_comm_pct']:.0f}% of the step "
                f"(efficiency {100 * at['scaling_efficiency']:.0f}%)"
            )
            if p.get("fp16_exposed_comm_pct") is not None:
                text += (
                    f"; the fp16 comm hook halves the bytes and would bring it to "
                    f"{p['fp16_exposed_comm_pct']:.0f}%"
                )
            severity = "warn" if at["exposed_comm_pct"] > 25 else "info"
            out.append({"severity": severity, "text": text + "."})
        low = next((x for x in p["predictions"] if x["scaling_efficiency"] < 0.5), None)
        if low is not None:
            if low["straggler_s"] > low["exposed_comm_s"]:
                cause = (
                    f"waiting for the slowest rank ({1e3 * low['straggler_s']:.1f} ms per step, "
                    f"from the measured step-time spread) costs more than exposed communication "
                    f"({1e3 * low['exposed_comm_s']:.1f} ms)"
                )
            else:
                cause = (
                    f"exposed communication ({1e3 * low['exposed_comm_s']:.1f} ms per step) "
                    "gives way first"
                )
            out.append(
                {
                    "severity": "warn",
                    "text": f"{p['run_id']} (comm {p['comm_run_id']}): projected efficiency drops "
                    f"below 50% at {low['ranks']} ranks: {cause}.",
                }
            )
        checks = [("replay of", r) for r in p.get("replays", [])]
        checks += [(f"{p['run_id']} projected to", m) for m in p["measured"]]
        for what, r in checks:
            bad = abs(r["error_pct"]) > REPLAY_GOAL_PCT
            out.append(
                {
                    "severity": "bad" if bad else "good",
                    "text": f"{what} {r['run_id']} at n={r['ranks']} (comm {p['comm_run_id']}): "
                    "projected "
                    f"{1e3 * r['predicted_step_time_s']:.2f} ms vs measured "
                    f"{1e3 * r['measured_step_time_s']:.2f} ms per step, error "
                    f"{r['error_pct']:+.1f}% (goal ≤ {REPLAY_GOAL_PCT:g}%)"
                    + (" — treat this projection with caution." if bad else "."),
                }
            )
    return out


def projection_context(data: dict[str, Any]) -> dict[str, Any]:
    """Everything the projection partial renders: figures, findings, tables, skipped inputs."""
    projections = data.get("projections") or []
    comm = data.get("comm") or []
    names = unique_labels(data.get("runs", []))
    return {
        "projections": projections,
        "comm": comm,
        "skipped": data.get("projection_skipped") or [],
        "findings": _findings(projections),
        "efficiency_figure": efficiency_figure(projections, names),
        "names": names,  # run id -> short label, for the headings
        "busbw_figure": busbw_figure(comm),
        "goal_pct": REPLAY_GOAL_PCT,
    }
