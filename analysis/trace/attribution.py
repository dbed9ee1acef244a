"""Which step each GPU kernel belongs to: the step whose CPU range launched it (HTA's rule).

A kernel is joined to its launch (the `cuda_runtime`/`cuda_driver` event) on the correlation id.
An **orphan kernel** is a GPU event whose correlation id matches no runtime launch in the trace,
in a trace that records launches at all: GPU work queued before the profiler went active (or whose
launch fell outside the recorded window). HTA inner-joins kernels on the kept CPU events'
correlation ids, so it drops them; dpscope does the same. Orphans are left out of every
HTA-definition figure, of the per-step split and of the per-op table; they never become
collective calls of their own (an annotation still in the trace that names one by External id
keeps it, as its device time); and they are counted per rank (`orphan_kernels`,
`orphan_kernel_us` = the sum of their durations) with one warning.
A trace that records no runtime launch at all (trimmed or synthetic traces, tb-profiler's test
traces) has no orphans: each kernel is attributed by its own start, as tb-profiler does.

HTA applies that filter, and its exclusion of the last ProfilerStep, only where the traces hold
two or more distinct ProfilerStep names (HTA 0.5.0 `Trace._filter_irrelevant_gpu_kernels`); with
one (a single-step trace) or none it keeps every kernel, orphans included, and only warns. So
does dpscope (`hta_filtered`): a trace with fewer than two steps keeps every GPU event in its one
analysed window, and its orphans are counted and kept.
"""

from __future__ import annotations

import numpy as np

__all__ = ["hta_filtered", "kernel_steps", "launches"]


def launches(
    k_start: np.ndarray,
    k_corr: np.ndarray,
    rt_start: np.ndarray,
    rt_tids: np.ndarray,
    rt_corr: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(launch time, launch thread code, orphan mask) of each kernel, joined on the correlation
    id of its runtime call. Unmatched kernels keep their own start and thread code -1; they are
    orphans only when the trace has runtime launches (see the module docstring)."""
    launch = k_start.copy()
    tids = np.full(k_start.size, -1, dtype=np.int64)
    orphan = np.zeros(k_start.size, dtype=bool)
    if not k_start.size or not rt_start.size:
        return launch, tids, orphan
    order = np.argsort(rt_corr, kind="stable")
    rt_sorted = rt_corr[order]
    pos = np.clip(np.searchsorted(rt_sorted, k_corr), 0, rt_sorted.size - 1)
    hit = rt_sorted[pos] == k_corr
    rt_idx = order[pos]
    launch[hit] = rt_start[rt_idx[hit]]
    tids[hit] = rt_tids[rt_idx[hit]]
    return launch, tids, ~hit


def hta_filtered(step_names: int) -> bool:
    """Whether HTA's kernel filter (orphans out, last step out) applies to traces holding
    `step_names` distinct ProfilerStep names: two or more (the module docstring)."""
    return step_names >= 2


def kernel_steps(
    launch_us: np.ndarray, orphan: np.ndarray, lo: np.ndarray, hi: np.ndarray, whole: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(step index, kept mask) of each kernel over the analysed windows [lo, hi]: the window
    containing its launch, orphans never kept. With `whole` (HTA's filter does not apply: fewer
    than two ProfilerSteps, one window) every kernel is in it, orphans included."""
    if whole:
        return np.zeros(launch_us.size, dtype=np.int64), np.ones(launch_us.size, dtype=bool)
    k_step = np.searchsorted(lo, launch_us, side="right") - 1
    valid = (k_step >= 0) & (launch_us <= hi[np.clip(k_step, 0, None)]) & ~orphan
    return k_step, valid
