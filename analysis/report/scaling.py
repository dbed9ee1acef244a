"""The sweep view of the report: group labels, the scaling curves and the long-form frame they
plot against world size.

A scaling study is tens of runs (world sizes × backends × seeds × platforms); the question it asks
is how throughput, speedup, memory and accuracy move with world size per backend. What that view
holds (one row per group of seeds, skipped runs folded by reason) is decided in analysis.runs.sweep;
this module labels and draws it.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from analysis.report.labels import Labels
from analysis.runs.entry import RunEntry
from analysis.runs.groups import GroupEntry
from analysis.runs.runsjson import RunsJson, read_runs_json

__all__ = [
    "GROUP_FIGURES_ABOVE",
    "MAX_CHIPS",
    "MAX_FINDINGS",
    "group_label",
    "group_labels",
    "scaling_figures",
    "scaling_frame",
    "workload_name",
]

# Above this many runs, per-run bars become unreadable (a 100-run sweep drew 70-bar figures):
# figures switch to one bar per group with error bars over seeds.
GROUP_FIGURES_ABOVE = 12
# A finding names at most this many runs, then "and N more".
MAX_CHIPS = 4
# Above GROUP_FIGURES_ABOVE runs, the findings after the first MAX_FINDINGS fold into a <details>.
MAX_FINDINGS = 12


def group_label(group: GroupEntry, *, show: tuple[str, ...] = ("workload", "os")) -> str:
    """`ddp·gloo·n4 · mlp/synthetic · Linux` style label of a group (seeds pooled); `show` picks
    which of the workload and platform parts to add (those that tell the report's groups apart)."""
    pieces = [str(group.strategy or group.mode or "?")]
    if group.backend not in (None, "none", "dp"):
        pieces.append(str(group.backend))
    pieces.append(f"n{group.world_size or '?'}")
    out = ["·".join(pieces)]
    if "workload" in show:
        out.append(workload_name(group))
    if "os" in show:
        out.append(str(group.os))
    # The rest of the same-workload key (analysis.runs.groups.WORKLOAD_KEY), where groups differ by
    # it: two groups must never share a label (bars with one label are pooled).
    out += [_VARIANT[k](getattr(group, k)) for k in _VARIANT if k in show]
    return " · ".join(out)


def workload_name(run: RunEntry | GroupEntry) -> str:
    """`model(args)/dataset(args)`, plus the loss when it is not cross_entropy: every part of the
    same-workload key that names the problem (e.g. `gpt(n_layer=1)/tokens`); a script run's
    caption (its file and arguments, analysis.runs.notes.workload_label)."""
    if run.script and run.workload_label:
        return str(run.workload_label)
    model, dataset = str(run.model), str(run.dataset)
    if run.model_args:
        model += f"({run.model_args})"
    if run.dataset_args:
        dataset += f"({run.dataset_args})"
    loss = run.loss
    return f"{model}/{dataset}" + (f" · {loss}" if loss not in (None, "cross_entropy") else "")


_VARIANT = {
    "scaling": lambda v: f"{v} scaling",
    "fixed_batch": lambda v: f"batch {v}",
    "amp": lambda v: f"amp {v}",
    "device_type": str,
}


def group_labels(data: RunsJson | dict[str, Any]) -> Labels:
    """run_id -> its group's label, naming the workload and platform only when the report holds
    several: figure labels are drawn as glyph paths, so every character costs page weight."""
    doc = read_runs_json(data)
    workload = ("workload", "model", "model_args", "dataset", "dataset_args", "loss")
    candidates = (("workload", workload), ("os", ("os",)), *((k, (k,)) for k in _VARIANT))
    show = tuple(
        part
        for part, keys in candidates
        if len({tuple(getattr(g, k) for k in keys) for g in doc.groups}) > 1
    )
    return Labels({rid: group_label(g, show=show) for g in doc.groups for rid in g.run_ids})


def scaling_frame(data: RunsJson | dict[str, Any]) -> pd.DataFrame:
    """Long frame of measured runs for the scaling curves: one row per run with world size, series.

    `series` is mode (+ backend, + batch, amp, device type and platform when several); curves
    never pool strong with weak scaling or one model with another: `panel` names the model,
    dataset and scaling of the curve.
    """
    rows = [
        {
            "world_size": r.num_devices or r.world_size,
            "mode": r.strategy or r.mode,
            "backend": r.backend,
            "os": r.os,
            "scaling": r.scaling,
            "fixed_batch": r.fixed_batch,
            "amp": r.amp,
            "device_type": r.device_type,
            "panel": r.workload_label or f"{r.model}/{r.dataset} · {r.scaling} scaling",
            "samples_per_s": r.samples_per_s,
            "speedup": r.speedup,
            "efficiency_pct": (
                100 * r.scaling_efficiency if r.scaling_efficiency is not None else None
            ),
            "peak_memory_mib": (
                r.peak_memory_bytes / 2**20 if r.peak_memory_bytes is not None else None
            ),
        }
        for r in read_runs_json(data).measured()
    ]
    cols = ["world_size", "mode", "backend", "os", "scaling", "fixed_batch", "amp", "device_type",
            "panel", "samples_per_s", "speedup", "efficiency_pct", "peak_memory_mib"]  # fmt: skip
    df = pd.DataFrame(rows, columns=cols)
    for col in ("world_size", "samples_per_s", "speedup", "efficiency_pct", "peak_memory_mib"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    backend = df["backend"].where(~df["backend"].isin(["none", "dp"]) & df["backend"].notna(), "")
    df["series"] = df["mode"].astype(str) + backend.map(lambda b: f" ({b})" if b else "")
    # Never pool across the same-workload key (analysis.runs.groups.WORKLOAD_KEY): the batch that
    # scaling fixes, amp, device type and OS split a curve when the report mixes them.
    for col in ("fixed_batch", "amp", "device_type", "os"):
        if df[col].nunique(dropna=False) > 1:
            df["series"] += " · " + df[col].map(
                lambda v, c=col: _VARIANT[c](v) if c in _VARIANT else str(v)
            )
    return df.dropna(subset=["world_size"])


def scaling_figures(frame: pd.DataFrame) -> list[dict[str, str]]:
    """One 4-panel figure per (model, dataset, scaling): throughput, speedup with the ideal line,
    efficiency and peak memory per device against world size; one line per mode/backend, mean
    over seeds with ±1 std error bars. Strong and weak scaling never share a figure."""
    # Lazy, for a real reason: report.tables imports this module for headline_rows, and a table
    # (the CLI-free CSVs, tests) must not load matplotlib; only drawing a scaling figure does.
    import matplotlib.pyplot as plt
    import seaborn as sns

    from analysis.report.figures import png_uri, theme

    out = []
    for panel, df in frame.groupby("panel", sort=True):
        if df["world_size"].nunique() < 1 or df["samples_per_s"].isna().all():
            continue
        theme()
        fig, axes = plt.subplots(1, 4, figsize=(15, 3.6))
        kw = dict(x="world_size", hue="series", marker="o", errorbar="sd", err_style="bars")
        top = max(float(df["world_size"].max()), 2.0)
        specs = [
            ("samples_per_s", "throughput (samples/s)", "Throughput"),
            ("speedup", "speedup vs single (×)", "Speedup"),
            ("efficiency_pct", "scaling efficiency (%)", "Efficiency"),
            ("peak_memory_mib", "peak memory per device (MiB)", "Peak memory / device"),
        ]
        for ax, (col, ylabel, title) in zip(axes, specs, strict=True):
            if col == "speedup":
                ax.plot([1, top], [1, top], ls="--", color="0.5", label="ideal (linear)")
            if col == "efficiency_pct":
                ax.axhline(100, ls="--", color="0.5", label="ideal (100%)")
            sub = df.dropna(subset=[col])
            if not sub.empty:
                sns.lineplot(data=sub, y=col, ax=ax, **kw)
            ax.set(xlabel="world size (devices)", ylabel=ylabel, title=title)
            ax.xaxis.get_major_locator().set_params(integer=True)
            if ax.get_legend() is not None:
                ax.get_legend().remove()
        handles, labels = axes[1].get_legend_handles_labels()
        fig.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 0.95))
        fig.suptitle(str(panel), fontsize=11)
        fig.tight_layout()
        out.append({"panel": str(panel), "uri": png_uri(fig)})
    return out
