"""run.json `eval.best` of dpscope's loop; the step metrics are profiler.stepmetrics' (re-exported
here for the callers that import them from this module)."""

from __future__ import annotations

from profiler.stepmetrics import step_metrics, throughput_rows

__all__ = ["best_epoch", "step_metrics", "throughput_rows"]


def best_epoch(epochs: list[dict]) -> dict | None:
    """The eval entry with the highest top-1 accuracy (earliest on ties); None without evals."""
    return max(epochs, key=lambda e: (e["top1_pct"], -e["epoch"])) if epochs else None
