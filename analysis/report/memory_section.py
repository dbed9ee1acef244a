"""The report's "Where the memory goes" part of the Memory section: the per-rank breakdown table,
a stacked bar of it per run, rank and device, the allocated-bytes timeline per rank with phase
bands and the static floor, and findings that name the cause of a difference between modes.

Reads only the runs JSON (`memory_breakdown` of each run and its trace ranks' `memory`); every
number is defined in docs/reference/metrics.md §11.
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from analysis.columns import C, mib
from analysis.report.figures import MIB, png_uri, theme
from analysis.report.findings import Finding, run_name
from analysis.report.tables import Table
from analysis.runs.compare import is_measured, workload_key
from analysis.trace.memory import downsample

__all__ = ["BREAKDOWN_COLS", "context", "floor_bytes", "memory_findings"]

STATIC = {
    "parameters_bytes": "parameters",
    "gradients_bytes": "gradients",
    "optimizer_state_bytes": "optimizer state",
    "buffers_bytes": "buffers",
    "ddp_buckets_bytes": "DDP buckets",
}
PHASE_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "optimizer": "#55a868"}
MAX_PANELS = 12  # timeline panels (run × rank × device); more would be unreadable
# Samples per drawn curve: a 9-inch panel shows no more, and each sample costs the inline SVG
# bytes (the JSON keeps its 1,500); block minima and maxima are kept, so every peak is drawn.
FIGURE_POINTS = 400

BREAKDOWN_COLS = [
    C(key="run_id", label="Run"),
    C(key="mode", label="Mode"),
    C(key="rank", label="Rank", kind="int"),
    C(key="device", label="Device"),
    mib(key="parameters_bytes", label="Parameters"),
    mib(key="gradients_bytes", label="Gradients"),
    mib(key="optimizer_state_bytes", label="Optimizer state"),
    mib(key="buffers_bytes", label="Buffers"),
    mib(key="ddp_buckets_bytes", label="DDP buckets"),
    mib(key="static_total_bytes", label="Static total"),
    mib(key="forward_peak_bytes", label="Forward peak"),
    mib(key="backward_peak_bytes", label="Backward peak"),
    mib(key="optimizer_peak_bytes", label="Optimizer peak"),
]


def _ok(run: dict[str, Any]) -> bool:
    return is_measured(run)


def floor_bytes(entry: dict[str, Any], mode: str | None) -> int | None:
    """Bytes that stay allocated between steps: the static total less the gradients, which
    `zero_grad(set_to_none=True)` frees every step, except under DDP with no unshared buckets
    (gradient-as-bucket-view), where the gradients are the bucket storage and stay."""
    total, grads = entry.get("static_total_bytes"), entry.get("gradients_bytes")
    if total is None or grads is None:
        return None
    if mode == "ddp" and entry.get("ddp_buckets_bytes") == 0:
        return int(total)
    return int(total - grads)


def breakdown_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"run_id": run["run_id"], "mode": run.get("mode"), **e}
        for run in filter(_ok, data.get("runs", []))
        for e in run.get("memory_breakdown") or []
    ]


def breakdown_figure(rows: list[dict[str, Any]], labels: dict[str, str]) -> str | None:
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
    cols = {**STATIC, "forward_peak_bytes": "activations (forward peak)"}
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


def _panels(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One timeline panel per traced rank and device that has a breakdown entry, of the first
    run of each configuration: other seeds of one configuration allocate the same way, and
    each panel costs the page about 13 KB."""
    out, drawn = [], set()
    for run in filter(_ok, data.get("runs", [])):
        config = (workload_key(run), run.get("mode"), run.get("backend"), run.get("world_size"))
        if config in drawn:
            continue
        drawn.add(config)
        entries = {(e["rank"], e["device"]): e for e in run.get("memory_breakdown") or []}
        for rank in (run.get("trace") or {}).get("ranks") or []:
            mem = rank.get("memory") or {}
            for dev in mem.get("devices", []):
                entry = entries.get((rank["rank"], dev["device"]))
                if entry is None or not dev["timeline"]["t_us"]:
                    continue
                out.append(
                    {
                        "run": run,
                        "rank": rank["rank"],
                        "dev": dev,
                        "phases": mem.get("phases", []),
                        "floor": floor_bytes(entry, run.get("mode")),
                    }
                )
    return out


def timeline_figure(
    data: dict[str, Any], labels: dict[str, str], max_panels: int = MAX_PANELS
) -> str | None:
    """Allocated bytes (MiB) over the profiled steps per run, rank and device, with the phase
    bands and the static floor. CUDA curves are the caching allocator's absolute total; CPU
    curves only count allocations made while profiling, so they are placed on the floor where
    the first traced forward begins (the value `start_level_bytes` there)."""
    everything = _panels(data)
    panels = everything[:max_panels]
    if not panels:
        return None
    theme()
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.3 * len(panels)), squeeze=False)
    if len(everything) > len(panels):
        fig.suptitle(f"the first {len(panels)} of {len(everything)} rank/device curves", fontsize=9)
    for ax, p in zip(axes[:, 0], panels, strict=True):
        dev, floor = p["dev"], p["floor"]
        t0 = min([ph["start_us"] for ph in p["phases"]] or dev["timeline"]["t_us"][:1])
        t, y = downsample(
            np.asarray(dev["timeline"]["t_us"], dtype=float),
            np.asarray(dev["timeline"]["allocated_bytes"], dtype=float),
            FIGURE_POINTS,
        )
        t = (pd.Series(t) - t0) / 1e3
        y = pd.Series(y)
        if (
            dev["device"] == "cpu"
            and floor is not None
            and dev.get("start_level_bytes") is not None
        ):
            y = y - dev["start_level_bytes"] + floor
        ax.step(t, y / MIB, where="post", color="black", linewidth=1.0, label="allocated")
        for ph in p["phases"]:
            ax.axvspan(
                (ph["start_us"] - t0) / 1e3,
                (ph["end_us"] - t0) / 1e3,
                color=PHASE_COLORS.get(ph["phase"], "grey"),
                alpha=0.18,
                linewidth=0,
            )
        if floor is not None:
            ax.axhline(floor / MIB, color="crimson", linestyle="--", linewidth=1.0)
        label = labels.get(p["run"]["run_id"], p["run"]["run_id"])
        ax.set_title(f"{label} · rank {p['rank']} · {dev['device']}", fontsize=9)
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


def _mean(entries: list[dict[str, Any]], key: str) -> float | None:
    vals = [e[key] for e in entries if e.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def _same_workload(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The one same-workload key (docs/reference/metrics.md §7), as for speedup baselines and groups."""
    return workload_key(a) == workload_key(b)


def static_difference(run: dict[str, Any], single: dict[str, Any]) -> dict[str, Any] | None:
    """Per-rank static memory of `run` less `single`'s (bytes, means over ranks), and the category
    that makes most of it (`cause`, `cause_bytes`); None without both breakdowns."""
    mine, base = run.get("memory_breakdown") or [], single.get("memory_breakdown") or []
    total, ref = _mean(mine, "static_total_bytes"), _mean(base, "static_total_bytes")
    grads = _mean(base, "gradients_bytes")
    if total is None or ref is None or not grads:
        return None
    deltas = {k: (_mean(mine, k) or 0) - (_mean(base, k) or 0) for k in STATIC}
    cause = max(deltas, key=lambda k: abs(deltas[k]))
    return {"total": total, "ref": ref, "grads": grads, "diff_bytes": total - ref,
            "cause": cause, "cause_bytes": deltas[cause],
            "buckets": _mean(mine, "ddp_buckets_bytes")}  # fmt: skip


def _vs_single(run: dict[str, Any], single: dict[str, Any]) -> Finding | None:
    """DDP vs single: the per-rank static difference and the category that makes it."""
    if (d := static_difference(run, single)) is None:
        return None
    total, ref, grads, diff = d["total"], d["ref"], d["grads"], d["diff_bytes"]
    name = run_name(run)
    if abs(diff) < 0.01 * ref:
        view = run.get("mode") == "ddp" and d["buckets"] == 0
        why = " (gradient-as-bucket-view: the gradients are views of DDP's buckets)" if view else ""
        text = f"{name} holds the same static memory per rank as Single ({_mib(total)}){why}."
        return Finding(rule="memory_breakdown", severity="good", text=text, run_ids=[run["run_id"]])
    cause = d["cause"]
    because = {
        "ddp_buckets_bytes": "DDP's gradient buckets",
        "optimizer_state_bytes": "optimizer state",
        "buffers_bytes": "module buffers (e.g. SyncBatchNorm)",
        "parameters_bytes": "parameters",
        "gradients_bytes": "gradients",
    }[cause]
    fix = (run.get("advice") or {}).get("bucket_view", "--gradient-as-bucket-view")
    hint = f"; {fix} removes it" if cause == "ddp_buckets_bytes" else ""
    text = (
        f"{name} holds {_mib(abs(diff))} ({abs(diff) / grads:.1f}× gradients) "
        f"{'more' if diff > 0 else 'less'} static memory per rank than Single: {because} "
        f"({_mib(d['cause_bytes'])}){hint}."
    )
    return Finding(
        rule="memory_breakdown",
        severity="info",
        text=text,
        run_ids=[run["run_id"], single["run_id"]],
    )


def _dp_gpu0(run: dict[str, Any]) -> Finding | None:
    """DP: what GPU 0 holds that the other GPUs do not."""
    entries = sorted(run.get("memory_breakdown") or [], key=lambda e: e["device"])
    if len(entries) < 2 or entries[0].get("static_total_bytes") is None:
        return None
    first, rest = entries[0], entries[1:]
    others = max((e.get("static_total_bytes") or 0) for e in rest)
    extra = first["static_total_bytes"] - others
    text = (
        f"DP keeps {_mib(extra)} more static memory on {first['device']} than on any other GPU: "
        "the module's parameters, gradients and optimizer state live there "
        f"({', '.join(f'{v} {_mib(first[k])}' for k, v in STATIC.items() if first.get(k))}); "
        "the other GPUs hold replicas only during forward and backward."
    )
    f0, f1 = first.get("forward_peak_bytes"), _mean(rest, "forward_peak_bytes")
    if f0 is not None and f1 is not None:
        text += (
            f" Forward peak: {_mib(f0)} on {first['device']} vs {_mib(f1)} on the others "
            "(the scattered input, gathered outputs and loss sit on the first GPU)."
        )
    return Finding(rule="memory_breakdown", severity="info", text=text, run_ids=[run["run_id"]])


def memory_findings(data: dict[str, Any]) -> list[Finding]:
    """One finding per DDP run that has a matching single run (same workload, WORKLOAD_KEY; the
    same seed preferred), and one per DP run on GPU 0's extra."""
    runs = [r for r in data.get("runs", []) if _ok(r) and r.get("memory_breakdown")]
    singles = [r for r in runs if r.get("mode") == "single"]
    out = []
    for run in runs:
        if run.get("mode") == "dp" and (f := _dp_gpu0(run)):
            out.append(f)
        if run.get("mode") != "ddp":  # DP's devices differ by design: the GPU-0 finding says why
            continue
        same = [s for s in singles if _same_workload(s, run)]
        base = next(
            (s for s in same if s.get("seed") == run.get("seed")), same[0] if same else None
        )
        if base is not None and (f := _vs_single(run, base)):
            out.append(f)
    # Static counts do not depend on the seed: runs of several seeds say the same sentence once.
    merged: dict[str, Finding] = {}
    for f in out:
        if f.text in merged:
            ids = merged[f.text].run_ids + [r for r in f.run_ids if r not in merged[f.text].run_ids]
            f = Finding(rule=f.rule, severity=f.severity, text=f.text, run_ids=ids)
        merged[f.text] = f
    return list(merged.values())


def context(
    data: dict[str, Any], labels: dict[str, str], figure_data: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What the template partial needs: the table, both figures and the findings. `labels` are
    the report's run labels (made once, so the figures here name runs as every other part does).
    The figures draw `figure_data` when given (a sweep's one run per group: static memory does
    not change with the seed), the table and findings every run."""
    shown = figure_data if figure_data is not None else data
    rows = breakdown_rows(data)
    return {
        "table": Table(
            id="memory_breakdown", columns=BREAKDOWN_COLS, rows=rows, csv="memory_breakdown.csv"
        ),
        "breakdown_figure": breakdown_figure(
            rows if shown is data else breakdown_rows(shown), labels
        ),
        # A sweep shows fewer curves: each is a full step trace, and the page must stay light.
        "timeline_figure": timeline_figure(
            shown, labels, MAX_PANELS if figure_data is None else MAX_PANELS // 2
        ),
        "findings": memory_findings(data),
    }
