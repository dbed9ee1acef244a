"""Reduce one rank's trace to its summary: per-step compute/comm/overlap/idle/data-wait, the
rank-level HTA figures, tb-profiler's split, and the collective instances for cross-rank matching.

Steps are the `ProfilerStep#N` ranges. The last one is dropped when there are two or more (HTA's
rule: the profiler stops inside it, so its GPU work is cut off); a trace without any is analysed
as one step spanning its CPU ops (tb-profiler's rule) and says so in `warnings`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from analysis.trace.attribution import hta_filtered, kernel_steps
from analysis.trace.c10d import phase_name
from analysis.trace.classify import COMM, COMPUTE, MAX_DUR_US, Classified, Ranges, classify
from analysis.trace.collectives import rank_instances
from analysis.trace.intervals import Intervals, clip, intersection_us, merge, total_us, union_us
from analysis.trace.loader import load_trace
from analysis.trace.memory import memory_summary
from analysis.trace.ops import rank_ops
from analysis.trace.tbprofiler import tb_split
from profiler.runfolder.clockprobe import ClockProbe
from profiler.runfolder.errors import InputError

__all__ = ["RankSummary", "summarize_file"]


def _windows(c: Classified, path: Path, warnings: list[str]) -> tuple[np.ndarray, np.ndarray, list]:
    """Analysed step windows (start, end, step number) in µs relative to the rank's origin."""
    if len(c.steps) == 0:
        lo, hi = c.cpu_span
        if hi <= lo:
            raise InputError(
                path,
                "no ProfilerStep ranges and no CPU ops",
                "profile with torch.profiler and call prof.step() every step",
            )
        warnings.append(
            f"{path}: no ProfilerStep#N ranges — analysed the whole trace as one step;"
            " call prof.step() every iteration for per-step numbers"
        )
        return np.array([lo]), np.array([hi]), [None]
    n = len(c.steps) - 1 if _filtered(c) else 1  # HTA drops the last, incomplete step
    return c.steps.start[:n], c.steps.end[:n], c.step_numbers[:n]


def _filtered(c: Classified) -> bool:
    """HTA's kernel filter applies to this trace (two or more ProfilerStep names, attribution)."""
    return hta_filtered(len(c.steps))


def _sel(r: Ranges, mask: np.ndarray) -> Intervals:
    return r.start[mask], r.end[mask]


def _outside_comm(c: Classified) -> np.ndarray:
    """Mask of compute ops not nested inside a collective annotation on the same thread (the
    copies a gloo thread makes while reducing belong to the collective, not to computation)."""
    keep = np.ones(len(c.compute_ops), dtype=bool)
    op_tids = c.compute_ops.tids
    a_tids = c.anchors.tids
    for tid in np.unique(c.anchors.tids).tolist():
        ms, me = merge(*_sel(c.anchors, a_tids == tid))
        on = np.flatnonzero(op_tids == tid)
        idx = np.searchsorted(ms, c.compute_ops.start[on], side="right") - 1
        inside = (idx >= 0) & (me[np.clip(idx, 0, None)] > c.compute_ops.start[on])
        keep[on[inside]] = False
    return keep


def _training_thread(c: Classified) -> np.ndarray:
    """Mask of compute ops on the training thread: the one that records `ProfilerStep#N` (it calls
    prof.step()); without steps, or when that thread has no ops, the thread with the most CPU-op
    time. Ops on other threads (a background saver, a prefetcher, gloo's own threads) are not the
    model's computation, and counting them would hide communication that the training waits on."""
    tids = c.compute_ops.tids
    if not tids.size:
        return np.ones(0, dtype=bool)
    on_step_thread = np.isin(tids, c.steps.tids)
    if on_step_thread.any():
        return on_step_thread
    busy = {t: total_us(merge(*_sel(c.compute_ops, tids == t))) for t in np.unique(tids).tolist()}
    return tids == max(busy, key=busy.get)


def _step_rows(c: Classified, lo: np.ndarray, hi: np.ndarray, numbers: list) -> list[dict]:
    gpu = len(c.kernels) > 0
    if gpu:  # a kernel belongs to the step whose CPU range launched it (HTA attributes the same)
        k_step, valid = kernel_steps(c.launch_us, c.orphan, lo, hi, not _filtered(c))
    else:
        ops = _sel(c.compute_ops, _outside_comm(c) & _training_thread(c))
        comm_all = merge(c.anchors.start, c.anchors.end)
    data_all = merge(c.data.start, c.data.end)
    rows = []
    for i, (s, e) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
        if gpu:
            mine = valid & (k_step == i)
            comp = merge(*_sel(c.kernels, mine & (c.kernel_cls == COMPUTE)))
            comm = merge(*_sel(c.kernels, mine & (c.kernel_cls == COMM)))
            busy = total_us(merge(*_sel(c.kernels, mine)))
        else:
            comp, comm = clip(merge(*ops), s, e), clip(comm_all, s, e)
            busy = union_us(comp, comm)
        comp_us, comm_us, overlap_us = total_us(comp), total_us(comm), intersection_us(comp, comm)
        rows.append(
            {
                "step": numbers[i],
                "step_time_us": e - s,
                "compute_us": comp_us,
                "comm_us": comm_us,
                "exposed_comm_us": comm_us - overlap_us,
                "overlap_us": overlap_us,
                "busy_us": busy,
                "idle_us": max(0.0, (e - s) - busy),
                "data_wait_us": total_us(clip(data_all, s, e)),
            }
        )
    return rows


def _compute(c: Classified, lo: np.ndarray, hi: np.ndarray, numbers: list) -> Intervals:
    """The analysed steps' computation, merged: compute kernels (GPU) or the training thread's
    ops outside collectives (CPU), as `_step_rows` splits each step."""
    if len(c.kernels):
        _, valid = kernel_steps(c.launch_us, c.orphan, lo, hi, numbers == [None])
        return merge(*_sel(c.kernels, valid & (c.kernel_cls == COMPUTE)))
    return merge(*_sel(c.compute_ops, _outside_comm(c) & _training_thread(c)))


def _hta_breakdown(c: Classified, lo: np.ndarray, hi: np.ndarray) -> dict:
    """HTA's temporal breakdown and comm/comp overlap over the kernels the analysed steps launched."""
    _, mine = kernel_steps(c.launch_us, c.orphan, lo, hi, not _filtered(c))
    allk = merge(*_sel(c.kernels, mine))
    if allk[0].size == 0:
        return {
            "kernel_time_us": None,
            "idle_us": None,
            "compute_pct": None,
            "non_compute_pct": None,
            "idle_pct": None,
            "overlap_pct": None,
        }
    comp = merge(*_sel(c.kernels, mine & (c.kernel_cls == COMPUTE)))
    comm = merge(*_sel(c.kernels, mine & (c.kernel_cls == COMM)))
    span = float(allk[1][-1] - allk[0][0])
    idle = span - total_us(allk)
    comm_us = total_us(comm)
    return {
        "kernel_time_us": span,
        "idle_us": idle,
        "compute_pct": 100 * total_us(comp) / span,
        "non_compute_pct": 100 * (span - total_us(comp) - idle) / span,
        "idle_pct": 100 * idle / span,
        "overlap_pct": 100 * intersection_us(comp, comm) / comm_us if comm_us else None,
    }


def _mean(rows: list[dict], key: str) -> float:
    return float(np.mean([r[key] for r in rows])) if rows else 0.0


class RankSummary(msgspec.Struct, kw_only=True):
    """One rank's trace reduced to what the traces JSON needs (docs/reference/metrics.md §4, §9, §11): the
    traces JSON's `ranks[]` row (`traces_row`), plus what only the cross-rank step uses
    (`world_size`, `backend`, `origin_ns` and the collective `instances`). Means are per
    analysed step, in µs."""

    rank: int | None
    file: str
    rank_source: str | None
    world_size: int | None
    backend: str | None
    kind: str  # "gpu" | "cpu"
    # The trace's host (Kineto's `host_name`), None when it has none: the clock alignment
    # gives ranks of one host one offset (analysis/trace/clocks.py).
    host: str | None = None
    # The trace's clock probe (profiler.runfolder.clockprobe), None when it has none.
    clock_probe: ClockProbe | None = None
    # The rank's first event on its own clock (ns, exact): the alignment origin; instance
    # `start_us` are relative to it.
    origin_ns: int
    steps: int
    dropped_events: int
    orphan_kernels: int  # GPU events whose launch is not in the trace (attribution.py)
    orphan_kernel_us: float  # the sum of their durations
    step_numbers: list[int | None]
    compute_us: float
    comm_us: float
    exposed_comm_us: float
    data_wait_us: float
    overlap_us: float
    idle_us: float
    step_time_us_mean: float
    overlap_pct: float | None
    idle_pct: float | None
    hta: dict[str, Any] | None
    tb_split: dict[str, Any]
    ops: list[dict[str, Any]]
    tb_split_steps: int  # tb-profiler averages over its own steps (all ProfilerSteps)
    tb_split_step_time_us_mean: float | None
    per_step: list[dict[str, Any]]
    warnings: list[str]
    # name -> column -> numpy array (rank_instances): never in the traces JSON; lists in a part
    instances: dict[str, dict[str, Any]]
    memory: dict[str, Any]
    ops_self_us_per_step: dict[str, float]
    # Every ProfilerStep number of the trace (the analysed ones and a dropped last): whether
    # HTA's filter applies is decided over all ranks' names (folder.combine_summaries).
    profiler_steps: list[int] = []
    # µs per analysed step of collectives' exposed time by the loop phase that issued them
    # (analysis.trace.c10d; {} without c10d ops): where a rank waited on communication.
    exposed_comm_us_by_phase: dict[str, float] = {}


_STEP_MEANS = ("compute_us", "comm_us", "exposed_comm_us", "data_wait_us", "overlap_us", "idle_us")


def _exposed_by_phase(instances: dict[str, dict[str, Any]], steps: int) -> dict[str, float]:
    """Exposed µs per step of every collective, summed by the loop phase that issued it."""
    out: dict[str, float] = {}
    for inst in instances.values():
        for code in np.unique(inst["phase"]).tolist():
            name = phase_name(code)
            if name:
                mine = float(inst["exposed_us"][inst["phase"] == code].sum()) / max(1, steps)
                out[name] = out.get(name, 0.0) + mine
    return out


def _orphan_us(c: Classified) -> float:
    return float((c.kernels.end[c.orphan] - c.kernels.start[c.orphan]).sum())


def _check_events(c: Classified, path: Path, warnings: list[str]) -> None:
    """A trace with no events is one InputError; dropped events are one warning."""
    if not len(c.kernels) and not len(c.compute_ops) and not len(c.anchors) and not len(c.steps):
        raise InputError(
            path,
            "no profiler events (no ops, kernels or ProfilerSteps)",
            "the profiler recorded nothing; check its schedule",
        )
    if c.orphan.any():
        n = int(c.orphan.sum())
        fate = (
            "left out of the step split, the HTA figures and the collective calls, as HTA does"
            if _filtered(c)
            else "kept in the step split and the HTA figures, as HTA keeps every kernel of a "
            "trace with fewer than two ProfilerSteps (never a collective call of their own)"
        )
        warnings.append(
            f"{path}: {n} GPU event(s) ({_orphan_us(c):.0f} µs) have no launch in the trace (likely"
            f" work queued before the profiler went active) — {fate}"
        )
    if c.step_notes:
        warnings.append(
            f"{path}: dropped {len(c.step_notes)} ProfilerStep range(s) that repeat or overlap"
            f" another ({'; '.join(c.step_notes[:3])}) — each step is counted once"
        )
    if c.dropped_events:
        warnings.append(
            f"{path}: dropped {c.dropped_events} event(s) with impossible times or of the wrong"
            " shape (ts/dur missing, negative or non-finite; a dur, or a ts's distance from the"
            f" trace's base, over {MAX_DUR_US:.3g} µs = 1 day; a `ProfilerStep#` without an ASCII"
            " number; a ts/dur/tid/name of the wrong JSON type) — not analysed"
        )


def summarize_file(path: Path) -> RankSummary:
    """Load one trace and reduce it to its summary (events are dropped before returning).

    Raises InputError with a one-line message when the file cannot be analysed.
    """
    loaded = load_trace(path)
    c = classify(loaded.event_chunks())
    loaded.raw_events = memoryview(b"")  # the summary is all we keep; free the JSON now
    warnings: list[str] = list(loaded.warnings)
    _check_events(c, path, warnings)
    lo, hi, numbers = _windows(c, loaded.path, warnings)
    per_step = _step_rows(c, lo, hi, numbers)
    gpu = len(c.kernels) > 0
    comm = sum(r["comm_us"] for r in per_step)
    step_time = _mean(per_step, "step_time_us")
    hta = _hta_breakdown(c, lo, hi) if gpu else None
    memory = memory_summary(c.memory, str(loaded.path))
    ops, timelines = rank_ops(c, lo, hi, not _filtered(c), step_time)
    origin_ns = loaded.origin_ns(c.origin_us)
    # µs from this rank's origin; each call's exposed part is what this computation leaves
    instances = rank_instances(c, float(lo[0]), float(hi[-1]), _compute(c, lo, hi, numbers))
    step_total = max(1e-9, sum(r["step_time_us"] for r in per_step))
    return RankSummary(
        rank=loaded.rank,
        file=str(loaded.path),
        rank_source=loaded.rank_source,
        world_size=loaded.world_size,
        backend=loaded.backend,
        host=loaded.host,
        clock_probe=loaded.clock_probe,
        kind="gpu" if gpu else "cpu",
        origin_ns=origin_ns,
        steps=len(per_step),
        dropped_events=c.dropped_events,
        orphan_kernels=int(c.orphan.sum()),
        orphan_kernel_us=_orphan_us(c),
        step_numbers=numbers,
        **{k: _mean(per_step, k) for k in _STEP_MEANS},
        step_time_us_mean=step_time,
        # On GPU traces the rank-level idle and overlap follow HTA's definitions exactly.
        overlap_pct=hta["overlap_pct"]
        if gpu
        else (100 * sum(r["overlap_us"] for r in per_step) / comm if comm else None),
        idle_pct=hta["idle_pct"] if gpu else 100 * sum(r["idle_us"] for r in per_step) / step_total,
        hta=hta,
        tb_split=tb_split(c.tb),
        ops=ops,
        tb_split_steps=len(c.tb.steps),
        tb_split_step_time_us_mean=(
            float(np.mean([e - s for s, e in c.tb.steps])) if c.tb.steps else None
        ),
        per_step=per_step,
        warnings=[*warnings, *memory["warnings"]],
        instances=instances,
        exposed_comm_us_by_phase=_exposed_by_phase(instances, len(per_step)),
        memory=memory,
        ops_self_us_per_step=timelines,
        profiler_steps=[int(n) for n in c.step_numbers],
    )
