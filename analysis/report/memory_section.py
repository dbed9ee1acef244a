"""The report's "Where the memory goes" part of the Memory section: the per-rank breakdown table,
a stacked bar of it per run, rank and device, the allocated-bytes timeline per rank with phase
bands and the static floor, and findings that name the cause of a difference between modes.

Words and draws what analysis.runs.memory decided (the breakdown rows, the static differences, DP's
first GPU, the timeline panels); every number is defined in docs/reference/metrics.md §11.
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from analysis.columns import Column, mib
from analysis.report.figures import MIB, png_uri, theme
from analysis.report.findings import Finding, run_name
from analysis.report.labels import Labels
from analysis.report.tables import Table
from analysis.runs.memory import (
    STATIC_KEYS,
    DpFirstGpu,
    StaticDelta,
    breakdown_rows,
    memory_cases,
    timeline_panels,
)
from analysis.runs.runsjson import RunsJson, read_runs_json
from analysis.trace.memory import downsample

__all__ = ["BREAKDOWN_COLS", "context", "memory_findings", "timeline_figure"]

STATIC = dict(
    zip(
        STATIC_KEYS,
        ("parameters", "gradients", "optimizer state", "buffers", "DDP buckets"),
        strict=True,
    )
)
PHASE_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "optimizer": "#55a868"}
MAX_PANELS = 12  # timeline panels (run × rank × device); more would be unreadable
# Samples per drawn curve: a 9-inch panel shows no more, and each sample costs the inline SVG
# bytes (the JSON keeps its 1,500); block minima and maxima are kept, so every peak is drawn.
FIGURE_POINTS = 400

BREAKDOWN_COLS = [
    Column(key="run_id", label="Run"),
    Column(key="mode", label="Mode"),
    Column(key="rank", label="Rank", kind="int"),
    Column(key="device", label="Device"),
    mib(key="parameters_bytes", label="Parameters"),
    mib(key="gradients_bytes", label="Gradients"),
    mib(key="optimizer_state_bytes", label="Optimizer state"),
    mib(key="buffers_bytes", label="Buffers"),
    mib(key="ddp_buckets_bytes", label="DDP buckets"),
    mib(key="static_total_bytes", label="Static total"),
    mib(key="fsdp_unsharded_peak_bytes", label="Unsharded peak (FSDP2)"),
    mib(key="forward_peak_bytes", label="Forward peak"),
    mib(key="backward_peak_bytes", label="Backward peak"),
    mib(key="optimizer_peak_bytes", label="Optimizer peak"),
]


def breakdown_figure(rows: list[dict[str, Any]], labels: Labels) -> str | None:
    """Stacked bar (MiB) per run, rank and device: the static categories and the forward peak."""
    df = pd.DataFrame(rows)
    if df.empty or df["static_total_bytes"].isna().all():
        return None
    df["bar"] = (
        df["run_id"].map(labels).fillna(df["run_id"])
        + " · rank "
        + df["rank"].astype(str)
        + " · "
        + df["device"]
    )
    cols = {
        **STATIC,
        "fsdp_unsharded_peak_bytes": "gathered blocks (FSDP2 peak)",
        "forward_peak_bytes": "activations (forward peak)",
    }
    cols = {k: v for k, v in cols.items() if k in df.columns}
    plot = df.set_index("bar")[list(cols)].astype(float).fillna(0.0) / MIB
    plot = plot.rename(columns=cols)
    theme()
    fig, ax = plt.subplots(figsize=(9, min(2.0 + 0.42 * len(plot), 14.0)))
    plot.iloc[::-1].plot.barh(
        stacked=True, ax=ax, width=0.7, color=sns.color_palette("tab10", len(cols))
    )
    ax.set(xlabel="memory (MiB)", ylabel="", title="Static memory by category + forward peak")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return png_uri(fig)


def timeline_figure(
    data: RunsJson | dict[str, Any],
    labels: dict[str, str] | None = None,
    max_panels: int = MAX_PANELS,
) -> str | None:
    """Allocated bytes (MiB) over the profiled steps per run, rank and device, with the phase
    bands and the static floor. CUDA curves are the caching allocator's absolute total; CPU
    curves only count allocations made while profiling, so they are placed on the floor where
    the first traced forward begins (the value `start_level_bytes` there)."""
    labels = Labels(labels or {})  # a plain mapping too: an id without a label shows as itself
    everything = timeline_panels(read_runs_json(data))
    panels = everything[:max_panels]
    if not panels:
        return None
    theme()
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.3 * len(panels)), squeeze=False)
    if len(everything) > len(panels):
        fig.suptitle(f"the first {len(panels)} of {len(everything)} rank/device curves", fontsize=9)
    for ax, p in zip(axes[:, 0], panels, strict=True):
        t, y = downsample(
            np.asarray(p.t_us, dtype=float),
            np.asarray(p.allocated_bytes, dtype=float),
            FIGURE_POINTS,
        )
        t = (pd.Series(t) - p.t0_us) / 1e3
        y = pd.Series(y)
        if p.on_floor:  # drawn where analysis.runs.memory places it
            y = y - p.start_level_bytes + p.floor_bytes
        ax.step(t, y / MIB, where="post", color="black", linewidth=1.0, label="allocated")
        for ph in p.phases:
            ax.axvspan(
                (ph.start_us - p.t0_us) / 1e3,
                (ph.end_us - p.t0_us) / 1e3,
                color=PHASE_COLORS[ph.phase] if ph.phase in PHASE_COLORS else "grey",
                alpha=0.18,
                linewidth=0,
            )
        if p.floor_bytes is not None:
            ax.axhline(p.floor_bytes / MIB, color="crimson", linestyle="--", linewidth=1.0)
        ax.set_title(f"{labels[p.run_id]} · rank {p.rank} · {p.device}", fontsize=9)
        ax.set(ylabel="MiB", xlabel="")
    axes[-1, 0].set_xlabel("time since the first traced phase (ms)")
    handles = [
        plt.Line2D([], [], color="black", label="allocated"),
        plt.Line2D([], [], color="crimson", linestyle="--", label="static floor"),
        *(
            plt.Rectangle((0, 0), 1, 1, color=c, alpha=0.3, label=n)
            for n, c in PHASE_COLORS.items()
        ),
    ]
    axes[0, 0].legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return png_uri(fig)


def _mib(n: float) -> str:
    return f"{n / MIB:.2f} MiB" if abs(n) < 10 * MIB else f"{n / MIB:.0f} MiB"


_BECAUSE = {
    "ddp_buckets_bytes": "DDP's gradient buckets",
    "optimizer_state_bytes": "optimizer state",
    "buffers_bytes": "module buffers (e.g. SyncBatchNorm)",
    "parameters_bytes": "parameters",
    "gradients_bytes": "gradients",
}


def _vs_single(d: StaticDelta) -> Finding:
    """DDP vs single: the per-rank static difference and the category that makes it."""
    run, diff = d.run, d.diff_bytes
    name = run_name(run)
    if d.sharded:  # every category shrinks at once: name the sharding itself
        gathered = d.gathered_bytes
        text = (
            f"{name} holds {_mib(abs(diff))} {'less' if diff < 0 else 'more'} static memory per "
            f"rank than Single: parameters, gradients and optimizer state are sharded over "
            f"{run.world_size} ranks (÷ {run.world_size}, plus padding)"
            + (f"; gathered blocks add {_mib(gathered)} at the peak" if gathered else "")
            + "."
        )
        return Finding(rule="memory_breakdown", severity="info", text=text,
                       run_ids=[run.run_id, d.single.run_id])  # fmt: skip
    if d.same:
        why = (
            " (gradient-as-bucket-view: the gradients are views of DDP's buckets)"
            if d.bucket_view
            else ""
        )
        text = f"{name} holds the same static memory per rank as Single ({_mib(d.total)}){why}."
        return Finding(rule="memory_breakdown", severity="good", text=text, run_ids=[run.run_id])
    hint = f"; {d.advice.bucket_view} removes it" if d.cause == "ddp_buckets_bytes" else ""
    text = (
        f"{name} holds {_mib(abs(diff))} ({d.grads_ratio:.1f}× gradients) "
        f"{'more' if diff > 0 else 'less'} static memory per rank than Single: {_BECAUSE[d.cause]} "
        f"({_mib(d.cause_bytes)}){hint}."
    )
    return Finding(rule="memory_breakdown", severity="info", text=text,
                   run_ids=[run.run_id, d.single.run_id])  # fmt: skip


def _dp_first_gpu(g: DpFirstGpu) -> Finding:
    """DP: what GPU 0 holds that the other GPUs do not."""
    text = (
        f"DP keeps {_mib(g.extra_bytes)} more static memory on {g.device} than on any other GPU: "
        "the module's parameters, gradients and optimizer state live there "
        f"({', '.join(f'{STATIC[k]} {_mib(v)}' for k, v in g.parts.items())}); "
        "the other GPUs hold replicas only during forward and backward."
    )
    if g.forward_peak_bytes is not None and g.others_forward_peak_bytes is not None:
        text += (
            f" Forward peak: {_mib(g.forward_peak_bytes)} on {g.device} vs "
            f"{_mib(g.others_forward_peak_bytes)} on the others "
            "(the scattered input, gathered outputs and loss sit on the first GPU)."
        )
    return Finding(rule="memory_breakdown", severity="info", text=text, run_ids=[g.run.run_id])


def memory_findings(data: RunsJson | dict[str, Any]) -> list[Finding]:
    """One finding per DDP, ZeRO-1 or FSDP2 run that has a matching single run and one per DP run on GPU 0's
    extra (analysis.runs.memory.memory_cases); runs of several seeds that say the same sentence
    (static counts do not depend on the seed) say it once, naming them all."""
    cases = memory_cases(read_runs_json(data).measured())
    out = [_dp_first_gpu(c) if isinstance(c, DpFirstGpu) else _vs_single(c) for c in cases]
    merged: dict[str, Finding] = {}
    for f in out:
        if f.text in merged:
            ids = merged[f.text].run_ids + [r for r in f.run_ids if r not in merged[f.text].run_ids]
            f = Finding(rule=f.rule, severity=f.severity, text=f.text, run_ids=ids)
        merged[f.text] = f
    return list(merged.values())


def context(doc: RunsJson, labels: Labels, figure_doc: RunsJson | None = None) -> dict[str, Any]:
    """What the template partial needs: the table, both figures and the findings. `labels` are
    the report's run labels (made once, so the figures here name runs as every other part does).
    The figures draw `figure_doc` when given (a sweep's one run per group: static memory does
    not change with the seed), the table and findings every run."""
    shown = figure_doc if figure_doc is not None else doc
    rows = breakdown_rows(doc.measured())
    return {
        "table": Table(
            id="memory_breakdown", columns=BREAKDOWN_COLS, rows=rows, csv="memory_breakdown.csv"
        ),
        "breakdown_figure": breakdown_figure(
            rows if shown is doc else breakdown_rows(shown.measured()), labels
        ),
        # A sweep shows fewer curves: each is a full step trace, and the page must stay light.
        "timeline_figure": timeline_figure(
            shown, labels, MAX_PANELS if figure_doc is None else MAX_PANELS // 2
        ),
        "findings": memory_findings(doc),
    }
