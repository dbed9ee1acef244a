"""run.json `metrics` from the per-rank step rows gathered on rank 0 (definitions as in
docs/run-folder.md; every value carries its unit in its name)."""

from __future__ import annotations

import numpy as np

__all__ = ["best_epoch", "step_metrics"]


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


def step_metrics(rows: list[dict]) -> dict:
    """Throughput and step-time metrics over non-warm-up steps (rows with warmup == 0).

    - `samples_per_s` (samples/s): samples of all ranks in measured steps divided by the
      longest per-rank sum of those steps' `step_time_s` (the slowest rank bounds the job).
    - `step_time_s`: {mean, p50, p95} in seconds over the measured steps of all ranks.
    - `per_rank`: per rank, its measured steps, its own samples/s (its samples / its summed step
      time) and its step-time mean/p50/p95 in seconds.
    """
    measured = [r for r in rows if not r["warmup"]]
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
    }


def best_epoch(epochs: list[dict]) -> dict | None:
    """The eval entry with the highest top-1 accuracy (earliest on ties); None without evals."""
    return max(epochs, key=lambda e: (e["top1_pct"], -e["epoch"])) if epochs else None
