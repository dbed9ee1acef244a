"""ProfilerStep ranges as analysed: numbered, one per number, none overlapping (docs §3).

`ProfilerStep#N` is written by `prof.step()`. A name whose N is not ASCII digits
(`ProfilerStep#`, `ProfilerStep#٣`, `ProfilerStep#x`) is not a step marker: that event is dropped
and counted, never the rank. Sorted by start, a step that repeats a kept step's number, or starts
before the previous kept step ends (on any thread), is dropped too, with one warning naming both
steps: two ranges for one step, or nested steps, would count the same time twice.
"""

from __future__ import annotations

import re

import numpy as np

__all__ = ["STEP_RE", "clean_steps"]

STEP_RE = re.compile(r"ProfilerStep\s*#\s*([0-9]+)", re.ASCII)  # HTA's pattern, ASCII digits


def clean_steps(
    names: list[str], start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, list[int], int, list[str]]:
    """(kept mask, their step numbers, events dropped for a bad number, notes on dropped
    duplicates/overlaps). `start` must be sorted."""
    keep = np.zeros(len(names), dtype=bool)
    numbers: list[int] = []
    bad, notes = 0, []
    seen: dict[int, int] = {}
    last = -1
    for i, name in enumerate(names):
        m = STEP_RE.match(name)
        if not m:
            bad += 1
            continue
        n = int(m.group(1))
        if n in seen or (last >= 0 and start[i] < end[last]):
            other = seen.get(n, last)
            what = "repeats" if n in seen else "overlaps"
            notes.append(
                f"ProfilerStep#{n} at {start[i]:.0f}–{end[i]:.0f} µs {what} ProfilerStep#"
                f"{numbers[int(keep[:other].sum())]} at {start[other]:.0f}–{end[other]:.0f} µs"
            )
            continue
        keep[i] = True
        seen[n] = i
        numbers.append(n)
        last = i
    return keep, numbers, bad, notes
