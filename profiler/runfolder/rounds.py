"""Rounds: the confidence interval of a figure measured once per round, and when `--repeat auto`
has measured enough (docs/reference/metrics.md, "Rounds and confidence intervals").

A *round* is one run of every mode in turn (single, DDP, ...), so drift and other jobs hit each
mode of a round alike; each round gives one speedup (its DDP run's headline throughput ÷ its
single run's). Over rounds:

- `bootstrap_ci`: the median and its percentile-bootstrap confidence interval: BOOTSTRAP_RESAMPLES
  resamples of the rounds with replacement, drawn by numpy's generator seeded with
  BOOTSTRAP_SEED (the same values give the same interval on every machine), the median of each,
  and the (1 − level)/2 and (1 + level)/2 quantiles of those medians (numpy's "linear" rule).
  One value gives the interval [v, v].
- `ci_within`: the interval lies within ±`frac` of the median (CI_HALF_WIDTH_FRAC, ±5%).
- `repeat_done`: `--repeat auto` stops after a round when every parallel mode's speedup interval is
  within ±5% (from AUTO_MIN_ROUNDS rounds on: with fewer, the interval is just the range of one
  or two values), or at the bound: AUTO_MAX_ROUNDS rounds, or `--repeat-budget-s` seconds.

Torch-free and in the contract package because the launcher stops its rounds on the interval
the analysis reports (analysis/runs/compare.py), from the same function.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "AUTO_MAX_ROUNDS",
    "AUTO_MIN_ROUNDS",
    "BOOTSTRAP_RESAMPLES",
    "BOOTSTRAP_SEED",
    "CI_HALF_WIDTH_FRAC",
    "CI_LEVEL",
    "bootstrap_ci",
    "ci_within",
    "repeat_done",
]

CI_LEVEL = 0.95
CI_HALF_WIDTH_FRAC = 0.05
AUTO_MIN_ROUNDS = 3
AUTO_MAX_ROUNDS = 5
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def bootstrap_ci(
    values: Sequence[float],
    *,
    level: float = CI_LEVEL,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float, float] | None:
    """(median, low, high) of the finite `values`: the median and its seeded percentile-bootstrap
    interval at `level` (the module docstring); None without a finite value."""
    xs = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if xs.size == 0:
        return None
    median = float(np.median(xs))
    if xs.size == 1:
        return median, median, median
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, xs.size, size=(resamples, xs.size))
    medians = np.median(xs[draws], axis=1)
    low, high = np.quantile(medians, [(1 - level) / 2, (1 + level) / 2])
    return median, float(low), float(high)


def ci_within(ci: tuple[float, float, float] | None, frac: float = CI_HALF_WIDTH_FRAC) -> bool:
    """True when the interval (median, low, high) lies within ±`frac` of its median."""
    if ci is None:
        return False
    median, low, high = ci
    # (1 + 1e-9): an interval exactly at ±frac is within, whatever the float rounding of the ends
    return median > 0 and max(median - low, high - median) <= frac * median * (1 + 1e-9)


def repeat_done(
    speedups: dict[str, list[float]],
    *,
    rounds: int,
    repeat: int | None,
    elapsed_s: float,
    budget_s: float | None,
) -> str | None:
    """Why the rounds stop after `rounds` rounds, or None to run another.

    `speedups`: per parallel mode, one speedup per round so far. `repeat`: a fixed round count
    (`--repeat N`), None for `--repeat auto`. `budget_s`: `--repeat-budget-s` (it replaces the
    AUTO_MAX_ROUNDS bound; another round starts only when the mean round so far fits in it)."""
    if repeat is not None:
        if rounds >= repeat:
            return f"{rounds} of {repeat} rounds"
    elif (
        rounds >= AUTO_MIN_ROUNDS
        and speedups
        and all(ci_within(bootstrap_ci(v)) for v in speedups.values())
    ):
        widths = ", ".join(f"{m} {_half_width_pct(v):.1f}%" for m, v in speedups.items())
        return f"the speedup's 95% CI is within ±{100 * CI_HALF_WIDTH_FRAC:.0f}% ({widths})"
    elif budget_s is None and rounds >= AUTO_MAX_ROUNDS:
        return f"the bound of {AUTO_MAX_ROUNDS} rounds (the CI is still wider than ±5%)"
    if budget_s is not None and rounds and elapsed_s + elapsed_s / rounds > budget_s:
        return f"the budget of {budget_s:g} s (another round would end past it)"
    return None


def _half_width_pct(values: list[float]) -> float:
    ci = bootstrap_ci(values)
    if ci is None or ci[0] <= 0:
        return math.nan
    median, low, high = ci
    return 100 * max(median - low, high - median) / median
