"""Per-operator time of one rank over its analysed steps, reduced in the trace worker.

Operators are the trace's `cpu_op` events plus the collective calls (`gloo:*`, `nccl:*`, ... —
user annotations in current PyTorch) and, on GPU traces, every GPU activity (kernels, memcpy,
memset) under a normalised name. Other user annotations (dpscope's `forward`/`backward` ranges,
`ProfilerStep#N`) are ranges, not operators. Definitions: docs/reference/metrics.md §9.
"""

from __future__ import annotations

import re

import numpy as np

from analysis.trace.attribution import kernel_steps
from analysis.trace.classify import Classified

__all__ = ["kernel_key", "rank_ops"]

_ARGS_RE = re.compile(r"\((?:[^()]|\([^()]*\))*\)\s*$")  # a trailing C++ parameter list
_HEX_RE = re.compile(r"0x[0-9a-fA-F]+")


def kernel_key(name: str) -> str:
    """A GPU kernel's name for matching across runs: without its trailing parameter list, hex
    addresses as `0x?`, whitespace collapsed (`void k<float>(float*, int)` → `void k<float>`)."""
    out = _HEX_RE.sub("0x?", _ARGS_RE.sub("", name))
    return " ".join(out.split()) or name


def _self_times(start: np.ndarray, end: np.ndarray, tids: np.ndarray) -> np.ndarray:
    """Duration minus the time of direct children (ops nested in it on the same thread)."""
    out = (end - start).tolist()
    s, e, t = start.tolist(), end.tolist(), tids.tolist()
    stack: list[int] = []
    tid = None
    for i in np.lexsort((-end, start, tids)).tolist():  # thread, then start, outer first
        if t[i] != tid:
            stack, tid = [], t[i]
        while stack and e[stack[-1]] <= s[i]:
            stack.pop()
        if stack:
            parent = stack[-1]
            out[parent] -= max(0.0, min(e[i], e[parent]) - s[i])
        stack.append(i)
    return np.maximum(np.asarray(out, dtype=np.float64), 0.0)


def _step_index(t: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Index of the analysed step whose [lo, hi) holds each time, -1 for none."""
    idx = np.searchsorted(lo, t, side="right") - 1
    ok = (idx >= 0) & (t < hi[np.clip(idx, 0, None)])
    return np.where(ok, idx, -1)


def _rows(names: list[str], kind: str, keep: np.ndarray, self_us, total_us, n: int) -> list:
    if not keep.any():
        return []
    uniq, inv = np.unique(np.asarray(names, dtype=object)[keep], return_inverse=True)
    calls = np.bincount(inv, minlength=uniq.size)
    selfs = np.bincount(inv, weights=self_us[keep], minlength=uniq.size)
    totals = np.bincount(inv, weights=total_us[keep], minlength=uniq.size)
    return [
        {
            "name": str(name),
            "kind": kind,
            "calls_per_step": float(c) / n,
            "self_us_per_step": float(su) / n,
            "total_us_per_step": float(tu) / n,
        }
        for name, c, su, tu in zip(uniq.tolist(), calls, selfs, totals, strict=True)
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
    selfs = _self_times(ev.start, ev.end, ev.tids)
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
