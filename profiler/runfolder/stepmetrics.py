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


def _traced_s(row: dict) -> float:
    """A traced step's own time: its `step_time_s` less the profiler's work at its end
    (`profiler_s`: starting, stopping and exporting the trace), which the trace never shows."""
    return max(0.0, row["step_time_s"] - (row.get("profiler_s") or 0.0))


def _slowest(by_rank: dict[int, list[float]]) -> list[float]:
    """The step times of the rank with the largest mean (the slowest rank bounds the job)."""
    return max(by_rank.values(), key=lambda v: float(np.mean(v)))


def _overhead(rows: list[dict], active: set[tuple[int, int]]) -> tuple[float | None, float | None]:
    """(profiler_overhead_pct, profiler_overhead_noise_pct).

    - profiler_overhead_pct: (mean own time of the profiler's active steps ÷ mean step time of
      the unprofiled measured steps − 1) × 100, each mean taken on the slowest rank (the rank
      with the largest mean in that set). A traced step's own time leaves out `profiler_s`
      (the trace export at the end of the active window is not the tracing's cost per step;
      run.json `metrics.profile[].export_s` reports it).
    - profiler_overhead_noise_pct: two standard errors of that difference of means, in % of the
      unprofiled mean: 200 × sqrt(s_t²/k + s_c²/m) ÷ mean_c over the same two sets (k traced and
      m unprofiled steps, sample standard deviations s; one traced step borrows s_c). An
      overhead at or below it cannot be told from step-to-step noise. None with fewer than two
      unprofiled steps.
    """
    if not active:  # --no-profile, or no active step inside the run
        return None, None
    traced: dict[int, list[float]] = {}
    clean: dict[int, list[float]] = {}
    for r in rows:
        if (r["rank"], r["step"]) in active:
            traced.setdefault(r["rank"], []).append(_traced_s(r))
        elif not r["warmup"] and not r.get("profiled"):
            clean.setdefault(r["rank"], []).append(r["step_time_s"])
    if not traced or not clean:
        return None, None
    t, c = np.asarray(_slowest(traced)), np.asarray(_slowest(clean))
    if c.mean() <= 0:
        return None, None
    pct = float((t.mean() / c.mean() - 1) * 100)
    if c.size < 2:
        return pct, None
    s_c = float(c.std(ddof=1))
    s_t = float(t.std(ddof=1)) if t.size > 1 else s_c
    noise = 200 * float(np.sqrt(s_t**2 / t.size + s_c**2 / c.size)) / float(c.mean())
    return pct, noise


def step_metrics(rows: list[dict], active: set[tuple[int, int]] | None = None) -> dict:
    """Throughput and step-time metrics over the measured, unprofiled steps (`throughput_rows`).

    - `samples_per_s` (samples/s): samples of all ranks in those steps divided by the longest
      per-rank sum of those steps' `step_time_s` (the slowest rank bounds the job).
    - `step_time_s`: {mean, p50, p95} in seconds over those steps of all ranks.
    - `per_rank`: per rank, its steps counted, its own samples/s (its samples / its summed step
      time) and its step-time mean/p50/p95 in seconds.
    - `profiler_overhead_pct`, `profiler_overhead_noise_pct`: see `_overhead`; `active` holds
      the (rank, step) pairs the profiler recorded (its schedule's active steps). None without
      both kinds of step.
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
    overhead, noise = _overhead(rows, active or set())
    return {
        "samples_per_s": samples / busiest_s if busiest_s > 0 else None,
        "step_time_s": _stats([r["step_time_s"] for r in measured]),
        "per_rank": per_rank,
        "profiler_overhead_pct": overhead,
        "profiler_overhead_noise_pct": noise,
        "warnings": [warning] if warning else [],
    }
