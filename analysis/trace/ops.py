"""Per-operator time of one rank over its analysed steps, reduced in the trace worker.

Operators are the trace's `cpu_op` events plus the collective calls (`gloo:*`, `nccl:*`, ... —
user annotations in current PyTorch) and, on GPU traces, every GPU activity (kernels, memcpy,
memset) under a normalised name. Other user annotations (dpscope's `forward`/`backward` ranges,
`ProfilerStep#N`) are ranges, not operators. Definitions: docs/reference/metrics.md §9.
"""

from __future__ import annotations

import re
from itertools import compress

import numpy as np

from analysis.trace.attribution import kernel_steps
from analysis.trace.classify import Classified

__all__ = ["kernel_key", "rank_ops", "self_times"]

_ARGS_RE = re.compile(r"\((?:[^()]|\([^()]*\))*\)\s*$")  # a trailing C++ parameter list
_HEX_RE = re.compile(r"0x[0-9a-fA-F]+")


def kernel_key(name: str) -> str:
    """A GPU kernel's name for matching across runs: without its trailing parameter list, hex
    addresses as `0x?`, whitespace collapsed (`void k<float>(float*, int)` → `void k<float>`)."""
    out = _HEX_RE.sub("0x?", _ARGS_RE.sub("", name))
    return " ".join(out.split()) or name


def _parents(s: np.ndarray, e: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per op, in the order (thread, start, outer first), the index of its direct parent in that
    order (-1: none): the last earlier op on its thread still open at its start (end > start).
    That is exactly the top of the stack a sequential scan keeps (pop while the top ended
    before this start), partial overlaps included; found for every op at once by binary
    lifting over a sparse table of running maxima of the ends, a barrier at each thread."""
    n = s.size
    # One barrier (end = +inf) before each thread's first op: no parent across threads.
    first = np.flatnonzero(np.r_[True, t[1:] != t[:-1]]) if n else np.empty(0, np.int64)
    pos = np.arange(n) + np.searchsorted(first, np.arange(n), side="right")
    ends = np.full(n + first.size, np.inf)
    ends[pos] = e
    tables = [ends]  # tables[k][j] = max(ends[j - 2^k + 1 .. j])
    while (1 << len(tables)) <= ends.size:
        prev, k = tables[-1], 1 << (len(tables) - 1)
        tables.append(np.maximum(prev, np.r_[np.full(k, np.inf), prev[:-k]]))
    p = pos - 1  # candidate: the element just before
    for k in range(len(tables) - 1, -1, -1):
        ok = p - (1 << k) + 1 >= 0
        skip = ok & (tables[k][np.clip(p, 0, None)] <= s)  # a whole window ended: skip it
        p = np.where(skip, p - (1 << k), p)
    is_barrier = np.isinf(ends[np.clip(p, 0, None)]) & (p >= 0)
    index_of = np.full(ends.size, -1)
    index_of[pos] = np.arange(n)
    return np.where((p >= 0) & ~is_barrier, index_of[np.clip(p, 0, None)], -1)


def self_times(start: np.ndarray, end: np.ndarray, tids: np.ndarray) -> np.ndarray:
    """Duration minus the time of direct children (ops nested in it on the same thread)."""
    order = np.lexsort((-end, start, tids))  # thread, then start, outer first
    s, e = start[order], end[order]
    parent = _parents(s, e, tids[order])
    out = e - s
    child = np.flatnonzero(parent >= 0)
    par = parent[child]
    cut = np.maximum(0.0, np.minimum(e[child], e[par]) - s[child])
    np.subtract.at(out, par, cut)  # in scan order, one by one: as a sequential scan subtracts
    result = np.empty_like(out)
    result[order] = out
    return np.maximum(result, 0.0)


def _step_index(t: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Index of the analysed step whose [lo, hi) holds each time, -1 for none."""
    idx = np.searchsorted(lo, t, side="right") - 1
    ok = (idx >= 0) & (t < hi[np.clip(idx, 0, None)])
    return np.where(ok, idx, -1)


def _unique(names: list[str]) -> tuple[list[str], np.ndarray]:
    """np.unique(names, return_inverse=True) by a dict: the names are a few hundred distinct
    vocabulary strings repeated (their hashes cached), and sorting them is a Python compare per
    pair (~5x slower on a 54 MB trace's ops)."""
    uniq = sorted(dict.fromkeys(names))
    code = {name: i for i, name in enumerate(uniq)}
    return uniq, np.fromiter(map(code.__getitem__, names), np.int64, len(names))


def _rows(names: list[str], kind: str, keep: np.ndarray, self_us, total_us, n: int) -> list:
    if not keep.any():
        return []
    uniq, inv = _unique(list(compress(names, keep.tolist())))
    calls = np.bincount(inv, minlength=len(uniq))
    selfs = np.bincount(inv, weights=self_us[keep], minlength=len(uniq))
    totals = np.bincount(inv, weights=total_us[keep], minlength=len(uniq))
    return [
        {
            "name": str(name),
            "kind": kind,
            "calls_per_step": float(c) / n,
            "self_us_per_step": float(su) / n,
            "total_us_per_step": float(tu) / n,
        }
        for name, c, su, tu in zip(uniq, calls, selfs, totals, strict=True)
    ]


def rank_ops(
    c: Classified, lo: np.ndarray, hi: np.ndarray, whole_trace: bool, step_time_us: float
) -> tuple[list[dict], dict[str, float]]:
    """(rows, self µs per step by timeline) over the analysed steps [lo, hi).

    A CPU op belongs to the step its start falls in; a GPU activity to the step whose CPU range
    launched it (as for compute, §3). Rows are sorted by self time, largest first; `pct_of_step`
    = self µs per step ÷ the mean step time × 100. Self times on one thread add up to at most the
    step time; gloo's threads and GPU streams run concurrently with the training thread, so the
    sum over all rows can exceed it — hence the per-timeline totals."""
    n = max(1, lo.size)
    ev = c.op_events
    total = ev.end - ev.start
    selfs = self_times(ev.start, ev.end, ev.tids)
    in_step = _step_index(ev.start, lo, hi) >= 0
    if len(c.steps):
        training = np.isin(ev.tids, c.steps.tids)
    else:  # no ProfilerStep: the thread with the most op time
        busy = {t: total[ev.tids == t].sum() for t in np.unique(ev.tids).tolist()}
        training = ev.tids == max(busy, key=busy.get) if busy else np.zeros(0, bool)
    rows = _rows(ev.names, "cpu", in_step, selfs, total, n)
    k = c.kernels
    if len(k):
        _, k_in = kernel_steps(c.launch_us, c.orphan, lo, hi, whole_trace)  # as rank._step_rows
        k_dur = k.end - k.start
        keys = {x: kernel_key(x) for x in set(k.names)}  # once per distinct name
        rows += _rows([keys[x] for x in k.names], "gpu", k_in, k_dur, k_dur, n)
    for r in rows:
        r["pct_of_step"] = 100 * r["self_us_per_step"] / step_time_us if step_time_us else None
    rows.sort(key=lambda r: (-r["self_us_per_step"], r["name"]))
    timelines = {
        "training_thread": float(selfs[in_step & training].sum()) / n,
        "other_threads": float(selfs[in_step & ~training].sum()) / n,
        "gpu": float(sum(r["self_us_per_step"] for r in rows if r["kind"] == "gpu")),
    }
    return rows, timelines
