"""The report's Projection section: projected scaling efficiency with its band (measured points
and replay error overlaid), bus bandwidth against message size from the comm benchmarks, and
findings. Every prediction is shown with its band ("1.7× (1.5–1.9×) at 8 ranks"), never bare.

Reads only the runs JSON (`comm`, `projections`, `projection_skipped`; see
analysis/project/runs.py): every number is computed there. A prediction without finite numbers
(damaged input) is left out of the figure and the findings rather than failing the report.
Every figure is an SVG data URI like the other sections'.
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from analysis.project.bands import band_text
from analysis.project.runs import FINDING_RANKS
from analysis.report.axes import bytes_axis, legend_outside
from analysis.report.figures import png_uri, theme
from analysis.report.tables import unique_labels

__all__ = [
    "REPLAY_GOAL_PCT",
    "SELF_REPLAY_GOAL_PCT",
    "efficiency_text",
    "projection_context",
    "speedup_text",
    "step_text",
    "table_rows",
]

REPLAY_GOAL_PCT = 10.0  # the target for replay and measured errors
SELF_REPLAY_GOAL_PCT = 2.0  # the self-replay (own traced comm) checks the arithmetic alone
BAND_KEYS = ("step_time_s", "speedup", "scaling_efficiency")


def _complete(x: dict) -> bool:
    """True when a prediction has every number the section renders (finite, with its band)."""
    keys = [*BAND_KEYS, *(f"{k}_{e}" for k in BAND_KEYS for e in ("low", "high"))]
    keys += ["exposed_comm_pct", "exposed_comm_s", "straggler_s", "compute_s", "comm_s"]
    return all(isinstance(x.get(k), int | float) and x[k] == x[k] for k in keys)


def speedup_text(x: dict) -> str:
    """A prediction's speedup with its band and world size: "1.70× (1.52–1.88×) at 8 ranks"."""
    band = band_text(x["speedup"], x["speedup_low"], x["speedup_high"], unit="×")
    return f"{band} at {x['ranks']} rank{'s' if x['ranks'] != 1 else ''}"


def efficiency_text(x: dict) -> str:
    """A prediction's efficiency with its band in %: "85% (76–94%)"."""
    e = [100 * x[k] for k in ("scaling_efficiency", "scaling_efficiency_low",
                              "scaling_efficiency_high")]  # fmt: skip
    return band_text(*e, "{:.0f}", "%")


def step_text(x: dict) -> str:
    """A prediction's step time with its band in ms: "12.30 (11.02–14.10) ms"."""
    t = [1e3 * x[k] for k in ("step_time_s", "step_time_s_low", "step_time_s_high")]
    return band_text(*t) + " ms"


def predictions(p: dict) -> list[dict]:
    """The projection's complete predictions (see _complete)."""
    return [x for x in p.get("predictions") or [] if _complete(x)]


def efficiency_figure(projections: list[dict], names: dict[str, str]) -> str | None:
    """Projected efficiency (%) vs world size per projection; measured DDP runs as points.
    `names`: run id -> the report's short label (figures never show a full run id)."""

    def _label(p: dict) -> str:
        comm = p["comm_run_id"]
        return (
            f"{names.get(p['run_id'], p['run_id'])} · {p['backend']} (comm {names.get(comm, comm)})"
        )

    rows = [
        {"label": _label(p), "ranks": x["ranks"], "eff": 100 * x["scaling_efficiency"],
         "low": 100 * x["scaling_efficiency_low"], "high": 100 * x["scaling_efficiency_high"]}
        for p in projections
        for x in predictions(p)
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
    for p in projections:  # measured points in their projection's colour
        for m in p["measured"]:
            if not isinstance(m.get("measured_scaling_efficiency"), int | float):
                continue
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
        preds = predictions(p)
        at = next((x for x in preds if x["ranks"] == FINDING_RANKS), None)
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
                f"(speedup {speedup_text(at)}, efficiency {efficiency_text(at)})"
            )
            if p.get("fp16_exposed_comm_pct") is not None:
                text += (
                    f"; the fp16 comm hook halves the bytes and would bring it to "
                    f"{p['fp16_exposed_comm_pct']:.0f}%"
                )
            severity = "warn" if at["exposed_comm_pct"] > 25 else "info"
            out.append({"severity": severity, "text": text + "."})
        low = next((x for x in preds if x["scaling_efficiency"] < 0.5), None)
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
                    f"below 50% at {low['ranks']} ranks ({efficiency_text(low)}; speedup "
                    f"{speedup_text(low)}): {cause}.",
                }
            )
        out += _check_findings(p)
    return out


def _num(r: dict, *keys: str) -> bool:
    return all(isinstance(r.get(k), int | float) and r[k] == r[k] for k in keys)


def _check_findings(p: dict) -> list[dict]:
    """One finding per replay and measured run: projected (with its band) vs measured; per
    self-replay (its own traced comm) its error, the projection's arithmetic alone."""
    out = []
    checks = [("replay of", r) for r in p.get("replays", [])]
    checks += [(f"{p['run_id']} projected to", m) for m in p.get("measured") or []]
    keys = ("error_pct", "predicted_step_time_s", "measured_step_time_s",
            "predicted_step_time_s_low", "predicted_step_time_s_high")  # fmt: skip
    for what, r in checks:
        if not _num(r, *keys):
            continue
        bad = abs(r["error_pct"]) > REPLAY_GOAL_PCT
        band = band_text(*(1e3 * r[k] for k in ("predicted_step_time_s",
                                                "predicted_step_time_s_low",
                                                "predicted_step_time_s_high")))  # fmt: skip
        inside = "inside" if r.get("in_band") else "outside"
        out.append({
            "severity": "bad" if bad else "good",
            "text": f"{what} {r['run_id']} at n={r['ranks']} (comm {p['comm_run_id']}): projected "
            f"{band} ms vs measured {1e3 * r['measured_step_time_s']:.2f} ms per step ({inside} "
            f"the band), error {r['error_pct']:+.1f}% (goal ≤ {REPLAY_GOAL_PCT:g}%)"
            + (" — treat this projection with caution." if bad else "."),
        })  # fmt: skip
        t = r.get("traced") if what == "replay of" else None
        if t and _num(t, "error_pct"):
            out.append({
                "severity": "good" if abs(t["error_pct"]) <= SELF_REPLAY_GOAL_PCT else "bad",
                "text": f"self-replay of {r['run_id']} from its own traced per-bucket comm: "
                f"{1e3 * t['predicted_step_time_s']:.2f} vs {1e3 * t['measured_step_time_s']:.2f}"
                f" ms, error {t['error_pct']:+.1f}% (the projection's arithmetic alone; goal ≤ "
                f"{SELF_REPLAY_GOAL_PCT:g}%).",
            })  # fmt: skip
    return out


def table_rows(p: dict) -> list[dict]:
    """The projection table's cells per prediction, bands included (the template renders them)."""
    return [
        {
            "ranks": x["ranks"],
            "batch": f"{x['per_device_batch']:.4g}",
            "step": step_text(x).removesuffix(" ms"),
            "compute": f"{1e3 * x['compute_s']:.2f}",
            "straggler": f"{1e3 * x['straggler_s']:.2f}",
            "comm": f"{1e3 * x['comm_s']:.2f}",
            "exposed": f"{x['exposed_comm_pct']:.1f}",
            "samples": f"{x['samples_per_s']:,.1f}",
            "speedup": band_text(x["speedup"], x["speedup_low"], x["speedup_high"]),
            "efficiency": efficiency_text(x).replace("%", ""),
        }
        for x in predictions(p)
    ]


def projection_context(data: dict[str, Any]) -> dict[str, Any]:
    """Everything the projection partial renders: figures, findings, tables, skipped inputs."""
    projections = data.get("projections") or []
    comm = data.get("comm") or []
    names = unique_labels(data.get("runs", []))
    return {
        "projections": projections,
        "tables": [table_rows(p) for p in projections],  # one per projection, in order
        "comm": comm,
        "skipped": data.get("projection_skipped") or [],
        "findings": _findings(projections),
        "efficiency_figure": efficiency_figure(projections, names),
        "names": names,  # run id -> short label, for the headings
        "busbw_figure": busbw_figure(comm),
        "goal_pct": REPLAY_GOAL_PCT,
    }
