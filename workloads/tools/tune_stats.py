"""The statistics behind `make tune-ddp` (pure functions, no torch): per-arm summaries, the
significance rule, the loss difference of lossy knobs, which knobs the greedy combination
tries and which combination it keeps, and when the budget stops the tune (workloads.tools.tune only
runs the trials). Definitions are in docs/reference/metrics.md §8 (DDP tuning); each function's docstring
repeats its own.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from functools import cache

__all__ = [
    "ALPHA",
    "LOSS_TOLERANCE",
    "budget_stop_reason",
    "combination",
    "compare",
    "greedy_combine",
    "greedy_order",
    "keep_combination",
    "loss_max_abs_diff",
    "mann_whitney_p",
    "summarize",
]

ALPHA = 0.10
"""Two-sided level of the significance test (the smallest p that 3 + 3 trials can reach)."""
LOSS_TOLERANCE = 0.01
"""Per-step loss difference (cross-entropy, nats) above which a knob is flagged as changing training."""


def summarize(values: list[float]) -> dict:
    """Median, min, max and spread (max − min as % of the median) of an arm's samples/s."""
    if not values:
        return {
            "samples_per_s_median": None,
            "samples_per_s_min": None,
            "samples_per_s_max": None,
            "spread_pct": None,
        }
    median = statistics.median(values)
    return {
        "samples_per_s_median": median,
        "samples_per_s_min": min(values),
        "samples_per_s_max": max(values),
        "spread_pct": 100.0 * (max(values) - min(values)) / median if median > 0 else None,
    }


@cache
def _count_u(n: int, m: int, u: int) -> int:
    """Orderings of n candidate and m baseline trials with Mann–Whitney U = u (no ties)."""
    if u < 0:
        return 0
    if n == 0 or m == 0:
        return int(u == 0)
    # The largest value is a candidate trial (it beats all m baseline trials) or a baseline one.
    return _count_u(n - 1, m, u - m) + _count_u(n, m - 1, u)


def mann_whitney_p(candidate: list[float], baseline: list[float]) -> float | None:
    """Exact two-sided Mann–Whitney p-value of `candidate` vs `baseline` (None if either is empty).

    U counts the (candidate, baseline) pairs where the candidate trial is faster (ties count ½).
    Under "the knob changes nothing" every ordering of the interleaved trials is equally likely,
    so P(U ≤ u) is the share of the C(n+m, n) orderings with U ≤ u; p = 2 · P(U ≤ min(U, nm − U)),
    capped at 1. With 3 + 3 trials the smallest possible p is 2 / C(6, 3) = 0.10: every candidate
    trial faster (or every one slower) than every baseline trial.
    """
    n, m = len(candidate), len(baseline)
    if not n or not m:
        return None
    u = sum((c > b) + 0.5 * (c == b) for c in candidate for b in baseline)
    tail = math.floor(min(u, n * m - u))
    below = sum(_count_u(n, m, k) for k in range(tail + 1))
    return min(1.0, 2.0 * below / math.comb(n + m, n))


def compare(candidate: list[float], baseline: list[float], *, alpha: float = ALPHA) -> dict:
    """A candidate arm against its interleaved baseline arm.

    - `speedup_vs_baseline`: median candidate samples/s ÷ median baseline samples/s;
      `speedup_min`/`speedup_max`: the candidate's slowest/fastest trial ÷ the baseline median.
    - `p_value`: `mann_whitney_p`; `significant`: p ≤ `alpha` (two-sided), so the candidate's
      trials sit beyond the baseline's run-to-run noise in one direction.
    """
    out = {
        **summarize(candidate),
        "samples_per_s_runs": list(candidate),
        "speedup_vs_baseline": None,
        "speedup_min": None,
        "speedup_max": None,
        "p_value": mann_whitney_p(candidate, baseline),
        "significant": False,
    }
    base = summarize(baseline)["samples_per_s_median"]
    if candidate and base:
        out["speedup_vs_baseline"] = out["samples_per_s_median"] / base
        out["speedup_min"] = min(candidate) / base
        out["speedup_max"] = max(candidate) / base
    out["significant"] = out["p_value"] is not None and out["p_value"] <= alpha
    return out


def loss_max_abs_diff(candidate: dict[int, float], baseline: dict[int, float]) -> float | None:
    """Largest |candidate − baseline| per-step training loss over the steps both recorded.

    Each loss is the step's global loss: the mean over ranks of steps.csv `loss`. Same seed, same
    data order and same initial weights, so a knob that does not change the arithmetic stays
    within float-reordering noise (about 1e-6) and a lossy one (compression hooks) shows its effect.
    """
    common = sorted(set(candidate) & set(baseline))
    if not common:
        return None
    return max(abs(candidate[s] - baseline[s]) for s in common)


def greedy_order(candidates: list[dict]) -> list[dict]:
    """The knobs the greedy combination adds, in order: the candidates that helped (significant,
    speedup > 1, loss not flagged), at most one per group (the fastest bucket size, comm hook or
    accumulation K; each flag on its own), the best bucket size first, then by speedup."""
    helped = [
        c
        for c in candidates
        if c.get("significant")
        and (c.get("speedup_vs_baseline") or 0) > 1
        and not c.get("loss_flagged")
    ]
    best: dict[str, dict] = {}
    for c in helped:
        group = c["group"]
        if group not in best or c["speedup_vs_baseline"] > best[group]["speedup_vs_baseline"]:
            best[group] = c
    ordered = sorted(best.values(), key=lambda c: -c["speedup_vs_baseline"])
    return sorted(ordered, key=lambda c: c["group"] != "bucket")  # stable: bucket first


def combination(current: dict, knob: dict) -> dict:
    """The arm that adds `knob` to `current`: name `current+knob`, both argument lists (current's
    first), lossy when either is."""
    return {
        "name": f"{current['name']}+{knob['name']}",
        "args": [*current["args"], *knob["args"]],
        "lossy": bool(current["lossy"] or knob["lossy"]),
    }


def keep_combination(combo: dict, current: dict) -> bool:
    """A measured combination replaces the current best when it is significant against its own
    interleaved baseline trials, its median speedup is above the current best's, and its loss is
    not flagged."""
    better = (combo.get("speedup_vs_baseline") or 0) > (current.get("speedup_vs_baseline") or 0)
    return bool(combo.get("significant")) and better and not combo.get("loss_flagged")


def greedy_combine(
    order: list[dict], measure: Callable[[dict, int], tuple[dict, bool]]
) -> dict | None:
    """The greedy combination over `greedy_order`'s knobs: start from the first (the best single
    knob), add each next knob to the current best, and keep the combination when
    `keep_combination` says so. `measure(combination(...), step)` runs that combination's trials
    (step 1, 2, ...) and returns its arm with `compare`'s statistics and whether the tune's budget
    ran out meanwhile; the combination measured when it ran out is still judged, and no further
    one is tried. Returns the best arm (None when no knob helped)."""
    if not order:
        return None
    current = order[0]
    for step, knob in enumerate(order[1:], start=1):
        combo, out_of_budget = measure(combination(current, knob), step)
        if keep_combination(combo, current):
            current = combo
        if out_of_budget:
            break
    return current


def budget_stop_reason(elapsed_s: float, durations_s: list[float], budget_s: float) -> str | None:
    """Why the tune stops before its next trial (None: go on). With a budget (`budget_s` > 0) and
    at least one trial done (the first always runs), the next trial is estimated to last the
    median (upper median) of the trials so far; the tune stops when it would end past the budget."""
    if budget_s <= 0 or not durations_s:
        return None
    estimate = sorted(durations_s)[len(durations_s) // 2]
    if elapsed_s + estimate <= budget_s:
        return None
    return (
        f"TUNE_BUDGET_S={budget_s:g} s reached: the next trial (about {estimate:.0f} s) would end "
        "after it"
    )
