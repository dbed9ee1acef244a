"""The end of a run: every rank's step rows and memory go to rank 0, which writes steps.csv and
run.json (atomically, so a reader never sees half a record).

Kept apart from the loop (workloads.train) because it runs once, after it: the loop only hands
over what it collected. The DDP bucket layout is read here, after training, because the reducer
rebuilds its buckets in gradient-ready order during the first steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
from torch import nn

from profiler.environment import collect_env
from profiler.modelinfo import ddp_info, model_metrics
from profiler.runfolder.errors import InputError
from profiler.runfolder.layout import RUN_JSON, write_run_json, write_steps_csv
from profiler.runfolder.records import read_record
from profiler.runfolder.schema import (
    BreakdownEntry,
    Eval,
    EvalEntry,
    MemoryEntry,
    Metrics,
    StepRow,
)
from profiler.runfolder.stepmetrics import step_metrics
from workloads.config import TrainConfig
from workloads.launch import faults
from workloads.runrecord import device_type, run_record
from workloads.train.context import RunContext, unwrap_model
from workloads.train.losses import best_epoch
from workloads.train.workload import WorkloadFacts

if TYPE_CHECKING:  # the loop's instruments: finish reads their results, never builds them
    from workloads.train.instruments import Instruments

__all__ = ["ddp_info", "finish"]


@dataclass(frozen=True)
class RankResults:
    """What one rank hands to rank 0 at the end: its rows, traced steps, memory and traces."""

    rank: int
    rows: list[StepRow]
    active_steps: list[int]
    memory: list[MemoryEntry]
    memory_after_first_step: list[MemoryEntry]
    memory_breakdown: list[BreakdownEntry]
    traces: list[str]


def _results(run_dir: Path, ctx: RunContext, rows: list[StepRow], inst: Instruments) -> RankResults:
    rec = inst.recording
    tracker = rec.memory.tracker
    return RankResults(
        rank=ctx.rank,
        rows=rows,
        active_steps=rec.profiler.active_steps,
        memory=msgspec.convert(tracker.summary(), list[MemoryEntry]),
        memory_after_first_step=msgspec.convert(
            tracker.summary_after_first_step(), list[MemoryEntry]
        ),
        memory_breakdown=msgspec.convert(rec.static.static.entries(), list[BreakdownEntry]),
        traces=[p.relative_to(run_dir).as_posix() for p in rec.profiler.session.trace_files()],
    )


def _run_metrics(
    gathered: list[RankResults],
    rows: list[StepRow],
    *,
    model: nn.Module,
    epoch_times: list[float],
    start: float,
) -> tuple[Metrics, list[str]]:
    """The run record's `metrics` from every rank's results (and the step metrics' warnings)."""
    metrics, warnings = step_metrics(rows, {(g.rank, s) for g in gathered for s in g.active_steps})
    metrics = msgspec.structs.replace(
        metrics,
        epoch_time_s=epoch_times,
        wall_time_s=time.perf_counter() - start,
        memory=[m for g in gathered for m in g.memory],
        memory_after_first_step=[m for g in gathered for m in g.memory_after_first_step],
        memory_breakdown=[m for g in gathered for m in g.memory_breakdown],
        **model_metrics(model, inner=unwrap_model(model)),
    )
    return metrics, warnings


def finish(
    cfg: TrainConfig,
    ctx: RunContext,
    run_dir: Path,
    *,
    model: nn.Module,
    rows: list[StepRow],
    inst: Instruments,
    evals: list[dict],
    eval_note: str | None,
    workload: WorkloadFacts,
    epoch_times: list[float],
    restarts: int,
    threads: int,
    start: float,
) -> None:
    """Gather every rank's rows and memory to rank 0, which writes steps.csv and run.json."""
    gathered = ctx.gather_to_main(_results(run_dir, ctx, rows, inst))
    if gathered is None:  # not rank 0
        return
    all_rows = sorted((r for g in gathered for r in g.rows), key=lambda r: (r.step, r.rank))
    write_steps_csv(run_dir, all_rows)
    metrics, warnings = _run_metrics(
        gathered, all_rows, model=model, epoch_times=epoch_times, start=start
    )
    epochs = [EvalEntry.from_fields(e) for e in evals]
    best = best_epoch(evals)
    record = run_record(
        cfg,
        ctx.plan,
        status="ok",
        env=collect_env(
            threads_per_rank=threads,
            device_type=device_type(ctx.plan),
            host_load=inst.recording.host.result,
        ),
        created_at=_created_at(run_dir),
        metrics=metrics,
        evals=Eval(
            epochs=epochs,
            best=None if best is None else EvalEntry.from_fields(best),
            note=eval_note,
            split_samples=workload.test_samples,  # what --eval-batches capped (epochs: samples)
        ),
        # Earlier attempts' traces too, after a restart (their names say which attempt).
        traces=faults.all_traces(run_dir)
        if restarts
        else sorted(t for g in gathered for t in g.traces),
        warnings=warnings,  # e.g. no unprofiled measured step: throughput fell back
        restarts=restarts or None,
        resumes=faults.read_attempts(run_dir) if restarts else None,
        workload=workload,
    )
    print(f"[rank0] wrote {write_run_json(run_dir, record)}", flush=True)


def _created_at(run_dir: Path) -> str | None:
    """`created_at` of the launcher's `running` record, kept in rank 0's; None when the trainer
    was started without the launcher (no record yet)."""
    try:
        rec, _ = read_record(run_dir / RUN_JSON)
    except InputError:
        return None
    return rec.created_at
