"""run.json `metrics` from the per-rank step rows (definitions as in docs/reference/run-folder.md; every
value carries its unit in its name).

Torch-free and in profiler/ because every writer of a run record computes them here: rank 0 of
dpscope's loop (workloads.train.finish), a RunRecorder (profiler.recorder) and the launcher
assembling a script run (profiler.runfolder.parts).
"""

from __future__ import annotations

import numpy as np

from profiler.runfolder.layout import throughput_steps

__all__ = ["step_metrics", "throughput_rows"]


def _stats(times: list[float]) -> dict:
    """{mean, p50, p95} of step times in seconds; nulls when there is no measured step."""
    if not times:
        return {"mean": None, "p50": None, "p95": None}
    arr = np.asarray(times, dtype=float)
    return {
        "mean": float(arr.mean()),
        "p50": float(np.percentile(arr, 50)),
        "p95": float(np.percentile(arr, 95)),
    }


def throughput_rows(rows: list[dict]) -> tuple[list[dict], str | None]:
    """The steps throughput is measured on, and the fallback's warning: the run-folder rule
    (profiler.runfolder.layout.throughput_steps) applied to step rows."""
    mask, warning = throughput_steps([r["warmup"] for r in rows], [r.get("profiled") for r in rows])
    return [r for r, keep in zip(rows, mask, strict=True) if keep], warning


def _overhead_pct(rows: list[dict], active: set[tuple[int, int]]) -> float | None:
    """profiler_overhead_pct: (mean step time of the profiler's active steps ÷ mean step time of
    the unprofiled measured steps − 1) × 100, each mean taken on the slowest rank (the rank with
    the largest mean in that set, since the slowest rank bounds the job)."""
    if not active:  # --no-profile, or no active step inside the run
        return None
    traced: dict[int, list[float]] = {}
    clean: dict[int, list[float]] = {}
    for r in rows:
        if (r["rank"], r["step"]) in active:
            traced.setdefault(r["rank"], []).append(r["step_time_s"])
        elif not r["warmup"] and not r.get("profiled"):
            clean.setdefault(r["rank"], []).append(r["step_time_s"])
    if not traced or not clean:
        return None
    slow_traced = max(float(np.mean(v)) for v in traced.values())
    slow_clean = max(float(np.mean(v)) for v in clean.values())
    return (slow_traced / slow_clean - 1) * 100 if slow_clean > 0 else None


def step_metrics(rows: list[dict], active: set[tuple[int, int]] | None = None) -> dict:
    """Throughput and step-time metrics over the measured, unprofiled steps (`throughput_rows`).

    - `samples_per_s` (samples/s): samples of all ranks in those steps divided by the longest
      per-rank sum of those steps' `step_time_s` (the slowest rank bounds the job).
    - `step_time_s`: {mean, p50, p95} in seconds over those steps of all ranks.
    - `per_rank`: per rank, its steps counted, its own samples/s (its samples / its summed step
      time) and its step-time mean/p50/p95 in seconds.
    - `profiler_overhead_pct`: see `_overhead_pct`; `active` holds the (rank, step) pairs the
      profiler recorded (its schedule's active steps). None without both kinds of step.
    - `warnings`: [str], the fallback note of `throughput_rows` when it applies.
    """
    measured, warning = throughput_rows(rows)
    per_rank = []
    busiest_s = 0.0
    for rank in sorted({r["rank"] for r in rows}):
        mine = [r for r in measured if r["rank"] == rank]
        total_s = sum(r["step_time_s"] for r in mine)
        busiest_s = max(busiest_s, total_s)
        stats = _stats([r["step_time_s"] for r in mine])
        per_rank.append(
            {
                "rank": rank,
                "steps": len(mine),
                "samples_per_s": sum(r["samples"] for r in mine) / total_s if total_s > 0 else None,
                "step_time_s_mean": stats["mean"],
                "step_time_s_p50": stats["p50"],
                "step_time_s_p95": stats["p95"],
            }
        )
    samples = sum(r["samples"] for r in measured)
    return {
        "samples_per_s": samples / busiest_s if busiest_s > 0 else None,
        "step_time_s": _stats([r["step_time_s"] for r in measured]),
        "per_rank": per_rank,
        "profiler_overhead_pct": _overhead_pct(rows, active or set()),
        "warnings": [warning] if warning else [],
    }
