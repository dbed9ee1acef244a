"""The projection inputs of a ZeRO-1 or FSDP2 run (analysis.project.sharded): its measured step
phases (steps.csv), the communication each rank's trace measured exposed in each phase
(`exposed_comm_us_by_phase`, as a share of its traced step applied to its measured step) taken
out of that phase so compute is compute, the slowest rank's compute kept; FSDP2's groups
(metrics.fsdp) and reshard_after_forward; ZeRO-1's DDP part (buckets, buffers) and parameter
sizes (metrics.param_grad_bytes); the algorithm each collective ran as (analysis.trace.c10d).
Definitions: docs/reference/metrics.md §10, "ZeRO-1 and FSDP2".
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from analysis.project.inputs import load_training, measured_steps
from analysis.project.model import ProjectionInputs
from analysis.trace.folder import analyze_trace_dir
from profiler.runfolder.errors import InputError, safe_text
from profiler.runfolder.layout import RUN_JSON, STEP_PHASES, STEPS_CSV
from profiler.runfolder.records import read_record
from profiler.runfolder.steps import read_steps_frame

__all__ = ["ShardedInputs", "algorithm", "is_sharded", "load_sharded"]


@dataclass(kw_only=True)
class ShardedInputs:
    """A ZeRO-1 or FSDP2 run as the projection reads it; seconds per step."""

    run_id: str
    path: str
    strategy: str
    """zero1 | fsdp | fsdp_keep."""
    backend: str | None
    device_type: str
    world_size: int
    scaling: str
    per_device_batch: int
    global_batch: int
    step_time_s: float
    phases_s: dict[str, float]
    compute_phases_s: dict[str, float]
    """phases_s less the exposed communication traced in each."""
    other_s: float
    step_samples_s: np.ndarray
    compute_s: float
    groups: list[dict] = field(default_factory=list)
    reshard_after_forward: bool = True
    param_bytes: list[int] = field(default_factory=list)
    algorithms: dict[str, str] = field(default_factory=dict)
    """collective -> what the backend ran it as (a key of BENCH_NAMES)."""
    traced_exposed_s: dict[str, float] = field(default_factory=dict)
    ddp: ProjectionInputs | None = None
    warnings: list[str] = field(default_factory=list)


def is_sharded(run_dir: Path) -> bool:
    """A finished-or-not ZeRO-1 or FSDP2 training run (False for anything unreadable)."""
    try:
        rec, _ = read_record(Path(run_dir) / RUN_JSON)
    except InputError:
        return False
    return rec.config.mode == "fsdp" or bool(rec.config.mode == "ddp" and rec.config.zero)


def _algorithms(trace: dict) -> dict[str, str]:
    """What each collective ran as (analysis.trace.c10d), from a traces JSON."""
    return {
        c["name"].split(":", 1)[-1]: str(c.get("algorithm") or c["name"]).split(":", 1)[-1]
        for c in trace.get("collectives") or []
    }


def _trace_of(run_dir: Path, trace: dict | None, traces: bool, warnings: list[str]) -> dict:
    if trace is not None or not traces:
        if not traces:
            warnings.append("traces not read: every phase taken as all compute (incl. comm waits)")
        return trace or {}
    try:
        return analyze_trace_dir(run_dir / "traces", progress=False)
    except InputError as err:
        warnings.append(f"{err} — every phase taken as all compute")
        return {}


def _compute_phases(body, trace: dict, warnings: list[str]) -> tuple[dict, dict]:  # noqa: ANN001
    """Per phase: the slowest rank's compute, i.e. its measured phase less the communication its
    own trace measured exposed in that phase (as a share of its traced step, applied to its
    measured step; floored at 10% of the phase), and the exposed seconds (mean over ranks). The
    slowest rank, not the mean: a rank that waits for a fuller one (ZeRO-1's partition) has the
    fuller rank's compute on its critical path."""
    traced = {r["rank"]: r for r in trace.get("ranks") or [] if r.get("step_time_us_mean")}
    per_rank = body.groupby("rank")[[f"{p}_s" for p in STEP_PHASES] + ["step_time_s"]].mean()
    compute: dict[str, list[float]] = {p: [] for p in STEP_PHASES}
    exposed: dict[str, list[float]] = {p: [] for p in STEP_PHASES}
    for rank, row in per_rank.iterrows():
        by_phase = (traced.get(int(rank)) or {}).get("exposed_comm_us_by_phase") or {}
        step_us = (traced.get(int(rank)) or {}).get("step_time_us_mean") or 1.0
        for p in STEP_PHASES:
            phase, out = float(row[f"{p}_s"]), by_phase.get(p, 0.0) / step_us * row["step_time_s"]
            compute[p].append(max(0.1 * phase, phase - out))
            exposed[p].append(min(out, 0.9 * phase))
    if trace and not any(r.get("exposed_comm_us_by_phase") for r in traced.values()):
        warnings.append("the traces have no collectives by phase: every phase taken as compute")
    return ({p: max(v) if p != "data" else statistics.fmean(v) for p, v in compute.items()},
            {p: statistics.fmean(v) for p, v in exposed.items() if any(v)})  # fmt: skip


def load_sharded(run_dir: Path, *, traces: bool = True, trace: dict | None = None) -> ShardedInputs:
    """A ZeRO-1 or FSDP2 run's projection inputs (the module docstring); one line otherwise."""
    run_dir = Path(run_dir)
    rec, _ = read_record(run_dir / RUN_JSON)
    cfg, metrics = rec.config, rec.metrics
    if not is_sharded(run_dir) or rec.status != "ok":
        raise InputError(run_dir, "is not a finished ZeRO-1 or FSDP2 run", "pass one that is")
    steps = read_steps_frame(run_dir / STEPS_CSV, world_size=cfg.world_size)
    body, fallback = measured_steps(steps, cfg)
    if body.empty:
        raise InputError(run_dir / STEPS_CSV, "has no measured step", "raise --max-steps")
    warnings = [fallback] if fallback else []
    phases = {p: float(body[f"{p}_s"].mean()) for p in STEP_PHASES}
    step = float(body["step_time_s"].mean())
    trace = _trace_of(run_dir, trace, traces, warnings)
    compute, exposed = _compute_phases(body, trace, warnings)
    exposed_share = min(sum(exposed.values()) / step, 0.9)
    inp = ShardedInputs(
        run_id=safe_text(rec.run_id or run_dir.name),
        path=str(run_dir),
        strategy="zero1" if cfg.mode == "ddp" else (
            "fsdp_keep" if cfg.fsdp and cfg.fsdp.reshard_after_forward is False else "fsdp"),
        backend=cfg.backend,
        device_type=(cfg.devices or ["cpu"])[0].split(":")[0],
        world_size=int(cfg.world_size or 1),
        scaling=cfg.scaling or "strong",
        per_device_batch=int(cfg.per_device_batch or 1),
        global_batch=int(cfg.global_batch or 1),
        step_time_s=step,
        phases_s=phases,
        compute_phases_s=compute,
        other_s=max(0.0, step - sum(phases.values())),
        step_samples_s=body["step_time_s"].to_numpy(dtype=float) * (1 - exposed_share),
        compute_s=step - sum(phases.values()) + sum(compute.values()),
        groups=[{f: getattr(g, f) for f in g.__struct_fields__} for g in metrics.fsdp.groups]
        if metrics.fsdp
        else [],
        reshard_after_forward=not (cfg.fsdp and cfg.fsdp.reshard_after_forward is False),
        param_bytes=list(metrics.param_grad_bytes or []),
        algorithms=_algorithms(trace),
        traced_exposed_s=exposed,
        warnings=warnings,
    )  # fmt: skip
    if inp.strategy != "zero1" and not inp.groups:
        raise InputError(
            run_dir / RUN_JSON, "has no metrics.fsdp groups", "re-run it with this dpscope"
        )
    if inp.strategy == "zero1":
        inp.ddp = load_training(run_dir, traces=False)
        inp.ddp.warnings.clear()  # its "traces not read" note: the exposed share is taken here
        inp.ddp.backward_compute_s = compute["backward"]
        inp.ddp.compute_s = inp.compute_s
        inp.ddp.step_samples_s = inp.step_samples_s
    return inp


def algorithm(inp: ShardedInputs, collective: str) -> str:
    """What `collective` runs as on the run's backend: from its traces, else gloo's rule."""
    if collective in inp.algorithms:
        return inp.algorithms[collective]
    return "all_reduce" if collective == "reduce_scatter" and inp.backend == "gloo" else collective
