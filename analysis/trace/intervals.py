"""Vectorised interval arithmetic on numpy arrays of [start, end) times (µs).

Merging sorts by start and starts a new group wherever a start lies beyond the running maximum of
the previous ends (`cummax`), as HTA does; no per-row Python. Touching intervals ([0, 1) and
[1, 2)) merge into one. Intersections are computed from lengths:
|A ∩ B| = |A| + |B| − |A ∪ B|, which holds for any two sets of intervals once each is merged.
"""

from __future__ import annotations

import numpy as np

__all__ = ["clip", "covered_us", "intersection_us", "merge", "total_us", "union_us"]

Intervals = tuple[np.ndarray, np.ndarray]


def merge(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Union of intervals as disjoint, sorted (starts, ends); empty and inverted ones are dropped."""
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    run_end = np.maximum.accumulate(ends)
    # A new group starts where this start lies strictly beyond every earlier end.
    new_group = np.empty(starts.size, dtype=bool)
    new_group[0] = True
    new_group[1:] = starts[1:] > run_end[:-1]
    first = np.flatnonzero(new_group)
    last = np.append(first[1:] - 1, starts.size - 1)
    return starts[first], run_end[last]


def total_us(intervals: Intervals) -> float:
    """Summed length of already-merged intervals."""
    starts, ends = intervals
    return float(np.sum(ends - starts))


def union_us(*sets: Intervals) -> float:
    """|A ∪ B ∪ ...| for any interval sets (merged or not)."""
    starts = np.concatenate([s for s, _ in sets]) if sets else np.empty(0)
    ends = np.concatenate([e for _, e in sets]) if sets else np.empty(0)
    return total_us(merge(starts, ends))


def intersection_us(a: Intervals, b: Intervals) -> float:
    """|A ∩ B| for two interval sets (each merged first)."""
    a, b = merge(*a), merge(*b)
    return max(0.0, total_us(a) + total_us(b) - union_us(a, b))


def clip(intervals: Intervals, lo: float, hi: float) -> Intervals:
    """Intervals cut to [lo, hi); parts outside vanish."""
    starts, ends = intervals
    starts, ends = np.clip(starts, lo, hi), np.clip(ends, lo, hi)
    keep = ends > starts
    return starts[keep], ends[keep]


def covered_us(merged: Intervals, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """|merged ∩ [s, e)| for each interval (s, e) at once; `merged` disjoint and sorted (merge's
    output). From the running covered length F(t) = |merged ∩ (−∞, t)|: F(e) − F(s)."""
    m_s, m_e = merged
    starts, ends = np.asarray(starts, np.float64), np.asarray(ends, np.float64)
    if m_s.size == 0 or starts.size == 0:
        return np.zeros(starts.size)
    before = np.concatenate([[0.0], np.cumsum(m_e - m_s)])  # covered length before interval i

    def running(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(m_s, t, side="right")  # intervals starting at or before t
        last = np.clip(i - 1, 0, None)
        inside = np.where(i > 0, np.clip(t - m_s[last], 0.0, m_e[last] - m_s[last]), 0.0)
        return before[np.clip(i - 1, 0, None)] * (i > 0) + inside

    return np.maximum(running(ends) - running(starts), 0.0)
