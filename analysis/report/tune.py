"""The report's "DDP tuning" section: one table and one figure per tune folder in the runs JSON
(`tunes`, analysis.runs.tune.TuneEntry). Numbers are the tuner's (docs/reference/metrics.md §8); this module only
arranges and plots them. Every string ends up in the page through Jinja2 autoescape."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import msgspec
import pandas as pd
import seaborn as sns

from analysis.columns import Column
from analysis.report.figures import figure_height, png_uri, theme
from analysis.report.tables import Table
from analysis.runs.tune import TuneArm, TuneEntry

__all__ = ["TUNE_COLS", "tune_figure", "tune_header", "tune_sections"]

TUNE_COLS = [
    Column(key="name", label="Candidate"),
    Column(key="args_text", label="Arguments"),
    Column(key="status", label="Status"),
    Column(key="trials_text", label="Trials ok"),
    Column(key="samples_per_s_median", label="Median throughput", unit="samples/s", kind="num", digits=1),
    Column(key="spread_pct", label="Spread (max − min)", unit="% of median", kind="num", digits=1),
    Column(key="speedup_vs_baseline", label="Speedup", unit="×", kind="num", digits=3),
    Column(key="speedup_range", label="Speedup range", unit="×"),
    Column(key="p_value", label="p (Mann–Whitney)", kind="num", digits=3),
    Column(key="significant_text", label="Significant"),
    Column(key="loss_text", label="Max loss Δ", unit="nats"),
    Column(key="reason", label="Notes", wrap=True),
]  # fmt: skip


def _row(arm: TuneArm, *, baseline: bool, tolerance: Any) -> dict[str, Any]:
    lo, hi, loss, flagged = (
        arm.speedup_min,
        arm.speedup_max,
        arm.loss_max_abs_diff,
        arm.loss_flagged,
    )
    notes = [arm.reason or "", arm.note or ""]
    if flagged:
        notes.append(f"loss differs from the baseline by more than {tolerance} nats")
    if baseline:
        notes.append("reference; loss Δ = its own trial-to-trial difference")
    return {
        **msgspec.structs.asdict(arm),
        "args_text": " ".join(arm.args) or "(workload as given)",
        "trials_text": f"{arm.trials_ok}/{arm.trials}",
        "speedup_range": "" if lo is None or hi is None else f"{lo:.3f}–{hi:.3f}",
        "significant_text": "" if baseline else ("yes" if arm.significant else "no"),
        "loss_text": "—" if loss is None else f"{loss:.2e}" + (" (flagged)" if flagged else ""),
        "reason": "; ".join(n for n in notes if n),
    }


def _times(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}×"


def tune_figure(tune: TuneEntry) -> str | None:
    """Speedup per candidate (median, bar from its slowest to its fastest trial), 1× marked."""
    rows = [
        {"candidate": c.name, "speedup": c.speedup_vs_baseline, "lo": c.speedup_min,
         "hi": c.speedup_max, "significant": "yes" if c.significant else "no"}
        for c in tune.candidates
        if c.speedup_vs_baseline is not None
    ]  # fmt: skip
    if not rows:
        return None
    df = pd.DataFrame(rows)
    theme()
    fig, ax = plt.subplots(figsize=(8, figure_height(len(df))))
    ax.hlines(df["candidate"], df["lo"], df["hi"], color="0.6", linewidth=3, zorder=1)
    sns.scatterplot(
        data=df, x="speedup", y="candidate", hue="significant", hue_order=["yes", "no"],
        s=70, zorder=2, ax=ax,
    )  # fmt: skip
    ax.axvline(1.0, color="0.3", linestyle="--", linewidth=1)
    ax.set(xlabel="speedup vs baseline (×; bar: slowest to fastest trial)", ylabel="")
    ax.legend(fontsize=8, title="significant", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return png_uri(fig)


# The header's pieces: (words with {key} fields, the tune.json keys they need); a piece whose keys
# the tune lacks is left out (a hand-written or older tune.json still renders).
_HEADER = [
    ("{model}", ("model",)),
    ("{dataset}", ("dataset",)),
    ("global batch {batch_size}", ("batch_size",)),
    ("{nproc} × {backend} on {device}", ("nproc", "backend", "device")),
    ("{steps} steps per trial", ("steps",)),
    ("{trials} trials per arm", ("trials",)),
]


def tune_header(tune: TuneEntry) -> str:
    """The tune's workload, rules and status in one line ("mlp · digits · global batch 64 · …")."""
    w, rules = tune.workload, tune.rules
    parts = [text.format(**w) for text, keys in _HEADER if all(k in w for k in keys)]
    if "args" in w and w["args"]:
        parts.append("ARGS " + " ".join(map(str, w["args"])))
    if "alpha" in rules:
        parts.append(f"significance level {rules['alpha']}")
    if "loss_tolerance" in rules:
        parts.append(f"loss flag above {rules['loss_tolerance']} nats")
    if tune.status is not None:
        parts.append(f"status {tune.status}")
    return " · ".join(parts)


def tune_sections(tunes: list[TuneEntry]) -> list[dict[str, Any]]:
    """One entry per tune: the tune itself, its Table (baseline first) and its figure."""
    out = []
    for i, tune in enumerate(tunes):
        tolerance = tune.rules["loss_tolerance"] if "loss_tolerance" in tune.rules else None
        rows = [_row(tune.baseline, baseline=True, tolerance=tolerance)]
        rows += [_row(c, baseline=False, tolerance=tolerance) for c in tune.candidates]
        out.append(
            {
                "tune": tune,
                "header": tune_header(tune),
                "table": Table(id=f"tune-{i}", columns=TUNE_COLS, rows=rows),
                "figure": tune_figure(tune),
                "best_speedup": _times(tune.best.speedup_vs_baseline if tune.best else None),
            }
        )
    return out
