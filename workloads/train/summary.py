"""run.json `eval.best` of dpscope's loop; the step metrics are profiler.stepmetrics' (re-exported
here for the callers that import them from this module)."""

from __future__ import annotations

from profiler.stepmetrics import step_metrics, throughput_rows

__all__ = ["best_epoch", "step_metrics", "throughput_rows"]


def best_epoch(epochs: list[dict]) -> dict | None:
    """The eval entry with the highest top-1 accuracy (token top-1 for sequences), or, for an
    output without one (e.g. regression), the lowest test loss; earliest on ties. None without
    evals."""
    if not epochs:
        return None
    if any(e.get("top1_pct") is None for e in epochs):
        return min(epochs, key=lambda e: (e["test_loss"], e["epoch"]))
    return max(epochs, key=lambda e: (e["top1_pct"], -e["epoch"]))
