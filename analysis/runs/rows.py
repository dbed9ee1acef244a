"""Per-run rows the report's tables and figures show, taken from each run entry and its traces JSON
(docs/reference/metrics.md §4, §9): the step breakdown with exposed comm carved out of DDP's
backward, the traces' collective, overlap and straggler rows, the memory entries, the profiled
steps' times and each rank's top operators.

Rows copied from the traces JSON keep its keys (the table columns name them); rows this module
computes are typed.
"""

from __future__ import annotations

from typing import Any

import msgspec

from analysis.runs.entry import RunEntry
from analysis.runs.runsjson import RunsJson

__all__ = [
    "OVERLAP_KEYS",
    "PhaseRow",
    "RankOps",
    "has_ops",
    "memory_rows",
    "phase_rows",
    "rank_ops",
    "step_points",
    "trace_rows",
]

OVERLAP_KEYS = ("rank", "steps", "step_time_us_mean", "comm_us", "exposed_comm_us", "overlap_pct")


class PhaseRow(msgspec.Struct, kw_only=True):
    """One run and rank's mean time per step (s) by phase, from steps.csv. DDP's allreduce runs
    inside backward (bucket hooks), so `exposed_comm_s` is part of `backward_s`; stacking it on
    top would count it twice. The traces cover only the few profiled steps, which run slower (the
    profiler's overhead), so the trace's exposed share of its step is applied to this rank's
    steps.csv step time, capped at backward: `backward_compute_s` = backward − exposed, and the
    bar adds up to the measured step. `other_s`: the step less the four phases (loop overhead)."""

    run_id: str
    rank: int | None
    data_s: float | None
    forward_s: float | None
    backward_s: float | None
    backward_compute_s: float | None
    exposed_comm_s: float | None
    optimizer_s: float | None
    other_s: float | None
    step_time_s: float | None


def _trace_ranks(run: RunEntry) -> dict[int, dict[str, Any]]:
    return {r["rank"]: r for r in (run.trace or {}).get("ranks") or []}


def _phase_row(run: RunEntry, p: dict[str, Any], tr: dict[str, Any]) -> PhaseRow:
    exposed, traced = tr.get("exposed_comm_us"), tr.get("step_time_us_mean")
    step, back = p.get("step_time"), p.get("backward")
    exposed_s = None
    if exposed is not None and traced and step is not None:
        exposed_s = exposed / traced * step
        if back is not None:
            exposed_s = min(exposed_s, back)
    # Carved out of backward for DDP only: ZeRO-1 also broadcasts in its optimizer step, FSDP2
    # all-gathers in forward (the Communication section splits them).
    ddp = run.strategy == "ddp"
    back_c = back - exposed_s if back is not None and exposed_s is not None and ddp else back
    phase_times = [p.get("data"), p.get("forward"), back, p.get("optimizer")]
    other = None
    if step is not None and None not in phase_times:
        other = max(step - sum(phase_times), 0.0)
    return PhaseRow(
        run_id=run.run_id, rank=p["rank"], data_s=p.get("data"), forward_s=p.get("forward"),
        backward_s=back, backward_compute_s=back_c, exposed_comm_s=exposed_s if ddp else None,
        optimizer_s=p.get("optimizer"), other_s=other, step_time_s=step,
    )  # fmt: skip


def phase_rows(doc: RunsJson) -> list[PhaseRow]:
    """One PhaseRow per measured run and rank with phases."""
    return [
        _phase_row(run, p, _trace_ranks(run).get(p["rank"], {}))
        for run in doc.measured()
        for p in run.phases_per_rank_s
    ]


def trace_rows(doc: RunsJson) -> tuple[list[dict], list[dict], list[dict]]:
    """(collectives, overlap, stragglers) rows of every run's traces JSON, each with its run_id:
    a collective's row as it is; a rank's overlap numbers (OVERLAP_KEYS) with its tb-profiler
    split as `tb_<part>`; a straggler row with the run's step-time spread over ranks (%)."""
    coll, overlap, strag = [], [], []
    for run in doc.runs:
        trace = run.trace or {}
        rid = run.run_id
        coll += [{"run_id": rid, **c} for c in trace.get("collectives") or []]
        for r in trace.get("ranks") or []:
            tb = r.get("tb_split") or {}
            overlap.append({"run_id": rid, **{k: r.get(k) for k in OVERLAP_KEYS},
                            **{f"tb_{k}": v for k, v in tb.items()}})  # fmt: skip
        spread = (trace.get("step_time_spread") or {}).get("spread_pct")
        strag += [{"run_id": rid, **s, "spread_pct": spread} for s in trace.get("stragglers") or []]
    return coll, overlap, strag


def memory_rows(doc: RunsJson) -> list[dict[str, Any]]:
    """Each measured run's memory entries (one per rank and device, as run.json has them) with
    the run's imbalance."""
    return [
        {"run_id": run.run_id, **m, "memory_imbalance_pct": run.memory_imbalance_pct,
         "memory_imbalance_max_over_mean": run.memory_imbalance_max_over_mean}
        for run in doc.measured()
        for m in run.memory
    ]  # fmt: skip


def step_points(doc: RunsJson) -> list[dict[str, Any]]:
    """Every profiled step's time (ms) per run and rank, from the traces."""
    return [
        {"run_id": r.run_id, "rank": rk["rank"], "step": s["step"],
         "step_time_ms": s["step_time_us"] / 1e3}
        for r in doc.runs
        for rk in (r.trace or {}).get("ranks") or []
        for s in rk.get("per_step") or []
        if s.get("step_time_us") is not None
    ]  # fmt: skip


def has_ops(run: RunEntry) -> bool:
    """An ok run whose analysed traces carry operator rows."""
    ranks = (run.trace or {}).get("ranks") or []
    return run.status == "ok" and any(r.get("ops") for r in ranks)


class RankOps(msgspec.Struct, kw_only=True):
    """One rank's top operators by self time per step (its traces JSON `ops` rows, the first
    `top`), its step (µs) and self µs per step on the training thread, the other threads and the
    GPU (`ops_self_us_per_step`)."""

    run_id: str
    rank: int
    step_time_us: float | None
    training_thread_us: float | None
    other_threads_us: float | None
    gpu_us: float | None
    ops: list[dict[str, Any]]


def rank_ops(doc: RunsJson, top: int) -> list[list[RankOps]]:
    """Per run with operator rows (has_ops), one RankOps per rank."""
    out = []
    for run in (r for r in doc.runs if has_ops(r)):
        ranks = []
        for rank in (run.trace or {})["ranks"]:
            lanes = rank.get("ops_self_us_per_step") or {}
            ranks.append(RankOps(
                run_id=run.run_id, rank=rank["rank"], step_time_us=rank.get("step_time_us_mean"),
                training_thread_us=lanes.get("training_thread"),
                other_threads_us=lanes.get("other_threads"), gpu_us=lanes.get("gpu"),
                ops=(rank.get("ops") or [])[:top],
            ))  # fmt: skip
        out.append(ranks)
    return out
