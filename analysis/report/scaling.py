"""The sweep view of the report: groups first, scaling curves, the headline comparison table.

A scaling study is tens of runs (world sizes × backends × seeds × platforms); the question it asks
is how throughput, speedup, memory and accuracy move with world size per backend. These helpers
reduce the runs JSON to that view: one row per group (runs that differ only by seed), skipped runs
folded by reason, and long-form frames the figures plot against world size.
"""

from __future__ import annotations

import statistics
from typing import Any

import pandas as pd

from analysis.runs.entry import is_measured

__all__ = [
    "GROUP_FIGURES_ABOVE",
    "MAX_CHIPS",
    "MAX_FINDINGS",
    "first_of_groups",
    "group_label",
    "group_labels",
    "headline_rows",
    "scaling_frame",
    "skipped_by_reason",
]

# Above this many runs, per-run bars become unreadable (a 100-run sweep drew 70-bar figures):
# figures switch to one bar per group with error bars over seeds.
GROUP_FIGURES_ABOVE = 12
# A finding names at most this many runs, then "and N more".
MAX_CHIPS = 4
# Above GROUP_FIGURES_ABOVE runs, the findings after the first MAX_FINDINGS fold into a <details>.
MAX_FINDINGS = 12


def group_label(group: dict[str, Any], *, show: tuple[str, ...] = ("workload", "os")) -> str:
    """`ddp·gloo·n4 · mlp/synthetic · Linux` style label of a group (seeds pooled); `show` picks
    which of the workload and platform parts to add (those that tell the report's groups apart)."""
    pieces = [str(group.get("mode") or "?")]
    if group.get("backend") not in (None, "none", "dp"):
        pieces.append(str(group["backend"]))
    pieces.append(f"n{group.get('world_size') or '?'}")
    out = ["·".join(pieces)]
    if "workload" in show:
        out.append(workload_name(group))
    if "os" in show:
        out.append(str(group.get("os")))
    # The rest of the same-workload key (analysis.runs.compare.WORKLOAD_KEY), where groups differ by it:
    # two groups must never share a label (bars with one label are pooled).
    out += [_VARIANT[k](group.get(k)) for k in _VARIANT if k in show]
    return " · ".join(out)


def workload_name(run: dict[str, Any]) -> str:
    """`model(args)/dataset(args)`, plus the loss when it is not cross_entropy: every part of the
    same-workload key that names the problem (e.g. `gpt(n_layer=1)/tokens`); a script run's
    caption (its file and arguments, analysis.runs.notes.workload_label)."""
    if run.get("script") and run.get("workload_label"):
        return str(run["workload_label"])
    model, dataset = str(run.get("model")), str(run.get("dataset"))
    if run.get("model_args"):
        model += f"({run['model_args']})"
    if run.get("dataset_args"):
        dataset += f"({run['dataset_args']})"
    loss = run.get("loss")
    return f"{model}/{dataset}" + (f" · {loss}" if loss not in (None, "cross_entropy") else "")


_VARIANT = {
    "scaling": lambda v: f"{v} scaling",
    "fixed_batch": lambda v: f"batch {v}",
    "amp": lambda v: f"amp {v}",
    "device_type": str,
}


def group_labels(data: dict[str, Any]) -> dict[str, str]:
    """run_id -> its group's label, naming the workload and platform only when the report holds
    several: figure labels are drawn as glyph paths, so every character costs page weight."""
    groups = data.get("groups", [])
    workload = ("workload", "model", "model_args", "dataset", "dataset_args", "loss")
    candidates = (("workload", workload), ("os", ("os",)), *((k, (k,)) for k in _VARIANT))
    show = tuple(
        part
        for part, keys in candidates
        if len({tuple(g.get(k) for k in keys) for g in groups}) > 1
    )
    return {rid: group_label(g, show=show) for g in groups for rid in g.get("run_ids", [])}


def first_of_groups(data: dict[str, Any]) -> dict[str, Any]:
    """The runs JSON with only the first run of each group: per-run detail (operator tables) that
    would repeat itself once per seed is shown for one representative run per group."""
    keep = {g["run_ids"][0] for g in data.get("groups", []) if g.get("run_ids")}
    return {**data, "runs": [r for r in data.get("runs", []) if r.get("run_id") in keep]}


def _mean(values: list[Any]) -> float | None:
    vals = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return statistics.fmean(vals) if vals else None


def _batch(run: dict[str, Any]) -> Any:
    return run.get("global_batch") if run.get("scaling") != "weak" else run.get("per_device_batch")


def headline_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per group, in the shape of the GLOO/NCCL and Windows/Linux comparisons.

    Per platform, backend, mode and world size: time per epoch (mean of the runs' epoch wall
    times), throughput, speedup, efficiency, peak memory per device and top-1, each the mean over
    the group's seeds (± std where the group has one). Peak memory per device is the mean of each
    run's largest device peak (`peak_memory_bytes`).
    """
    runs = {r["run_id"]: r for r in data.get("runs", []) if isinstance(r.get("run_id"), str)}
    rows = []
    for g in data.get("groups", []):
        members = [runs[i] for i in g.get("run_ids") or [] if i in runs]
        rows.append(
            {
                "group": group_label(g),
                "os": g.get("os"),
                "backend": g.get("backend"),
                "mode": g.get("mode"),
                "world_size": g.get("world_size"),
                "model": g.get("model"),
                "dataset": g.get("dataset"),
                "scaling": g.get("scaling"),
                "batch": _batch(members[0]) if members else None,
                "n_seeds": g.get("n_seeds"),
                "epoch_time_s": _mean([m.get("epoch_time_s") for m in members]),
                **{
                    k: g.get(k)
                    for k in (
                        "samples_per_s_mean",
                        "samples_per_s_std",
                        "speedup_mean",
                        "speedup_std",
                        "scaling_efficiency_mean",
                        "scaling_efficiency_std",
                        "top1_pct_mean",
                        "top1_pct_std",
                    )
                },
                "peak_memory_bytes": _mean([m.get("peak_memory_bytes") for m in members]),
            }
        )
    order = {"single": 0, "dp": 1, "ddp": 2}
    return sorted(
        rows,
        key=lambda r: (
            str(r["os"]),
            str(r["model"]),
            str(r["scaling"]),
            str(r["backend"]),
            order.get(r["mode"], 9),
            r["world_size"] or 0,
        ),
    )


def skipped_by_reason(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Skipped runs (and unreadable folders) folded to one entry per reason, with the count.

    A 96-run CPU sweep had 72 skipped runs restating three reasons; one line each is enough.
    """
    folded: dict[str, list[str]] = {}
    for run in data.get("runs", []):
        if run.get("status") == "skipped":
            err = run.get("error")
            reason = err.get("message") if isinstance(err, dict) else err
            folded.setdefault(str(reason or "no reason recorded"), []).append(str(run["run_id"]))
    return [
        {"reason": reason, "count": len(ids), "run_ids": sorted(ids)}
        for reason, ids in sorted(folded.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    ]


def scaling_frame(data: dict[str, Any]) -> pd.DataFrame:
    """Long frame of ok runs for the scaling curves: one row per run with world size, series.

    `series` is mode (+ backend, + batch, amp, device type and platform when several); curves
    never pool strong with weak scaling or one model with another: `panel` names the model,
    dataset and scaling of the curve.
    """
    rows = [
        {
            "world_size": r.get("num_devices") or r.get("world_size"),
            "mode": r.get("mode"),
            "backend": r.get("backend"),
            "os": r.get("os"),
            "scaling": r.get("scaling"),
            **{k: r.get(k) for k in ("fixed_batch", "amp", "device_type")},
            "panel": r.get("workload_label")
            or f"{r.get('model')}/{r.get('dataset')} · {r.get('scaling')} scaling",
            "samples_per_s": r.get("samples_per_s"),
            "speedup": r.get("speedup"),
            "efficiency_pct": (
                100 * r["scaling_efficiency"]
                if isinstance(r.get("scaling_efficiency"), int | float)
                else None
            ),
            "peak_memory_mib": (
                r["peak_memory_bytes"] / 2**20
                if isinstance(r.get("peak_memory_bytes"), int | float)
                else None
            ),
        }
        for r in data.get("runs", [])
        if is_measured(r)
    ]
    cols = ["world_size", "mode", "backend", "os", "scaling", "fixed_batch", "amp", "device_type",
            "panel", "samples_per_s", "speedup", "efficiency_pct", "peak_memory_mib"]  # fmt: skip
    df = pd.DataFrame(rows, columns=cols)
    for col in ("world_size", "samples_per_s", "speedup", "efficiency_pct", "peak_memory_mib"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    backend = df["backend"].where(~df["backend"].isin(["none", "dp"]) & df["backend"].notna(), "")
    df["series"] = df["mode"].astype(str) + backend.map(lambda b: f" ({b})" if b else "")
    # Never pool across the same-workload key (analysis.runs.compare.WORKLOAD_KEY): the batch that
    # scaling fixes, amp, device type and OS split a curve when the report mixes them.
    for col in ("fixed_batch", "amp", "device_type", "os"):
        if df[col].nunique(dropna=False) > 1:
            df["series"] += " · " + df[col].map(lambda v, c=col: _VARIANT.get(c, str)(v))
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
