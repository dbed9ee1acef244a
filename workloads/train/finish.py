"""The end of a run: every rank's step rows and memory go to rank 0, which writes steps.csv and
run.json (atomically, so a reader never sees half a record).

Kept apart from the loop (workloads.train) because it runs once, after it: the loop only hands
over what it collected. The DDP bucket layout is read here, after training, because the reducer
rebuilds its buckets in gradient-ready order during the first steps.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from torch import nn

from profiler.memory import MemoryTracker
from profiler.memory_breakdown import StaticMemory
from profiler.modelinfo import ddp_info, model_metrics
from profiler.runfolder.errors import InputError
from profiler.runfolder.layout import RUN_JSON, write_run_json, write_steps_csv
from profiler.runfolder.records import read_record
from profiler.runfolder.stepmetrics import step_metrics
from profiler.session import ProfilerSession
from workloads.config import TrainConfig
from workloads.launch import faults
from workloads.record import run_record
from workloads.train.context import RunContext, unwrap_model
from workloads.train.losses import best_epoch
from workloads.train.workload import WorkloadFacts

if TYPE_CHECKING:  # the loop's instruments: finish reads their results, never builds them
    from workloads.train.instruments import Instruments

__all__ = ["ddp_info", "finish"]


def _rank_part(
    run_dir: Path,
    ctx: RunContext,
    *,
    rows: list[dict],
    active_steps: list[int],
    memory: MemoryTracker,
    static: StaticMemory,
    profiler: ProfilerSession,
) -> dict:
    """What this rank hands to rank 0: its rows, traced steps, memory and trace files."""
    return {
        "rows": rows,
        "rank": ctx.rank,
        "active_steps": active_steps,
        "memory": memory.summary(),
        "memory_after_first_step": memory.summary_after_first_step(),
        "memory_breakdown": static.entries(),
        "traces": [p.relative_to(run_dir).as_posix() for p in profiler.trace_files()],
    }


def _run_metrics(
    gathered: list[dict], rows: list[dict], *, model: dict, epoch_times: list[float], start: float
) -> tuple[dict, list[str]]:
    """run.json `metrics` from every rank's part (and the warnings of the step metrics)."""
    metrics = step_metrics(rows, {(g["rank"], s) for g in gathered for s in g["active_steps"]})
    warnings = metrics.pop("warnings")
    metrics = {
        **metrics,
        "epoch_time_s": epoch_times,
        "wall_time_s": time.perf_counter() - start,
        "memory": [m for g in gathered for m in g["memory"]],
        "memory_after_first_step": [m for g in gathered for m in g["memory_after_first_step"]],
        "memory_breakdown": [m for g in gathered for m in g["memory_breakdown"]],
        **model,
    }
    return metrics, warnings


def finish(
    cfg: TrainConfig,
    ctx: RunContext,
    run_dir: Path,
    *,
    model: nn.Module,
    rows: list[dict],
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
    mine = _rank_part(
        run_dir,
        ctx,
        rows=rows,
        active_steps=inst.profiler.active_steps,
        memory=inst.memory.tracker,
        static=inst.static.static,
        profiler=inst.profiler.session,
    )
    gathered = ctx.gather_to_main(mine)
    if gathered is None:  # not rank 0
        return
    all_rows = sorted(
        (r for g in gathered for r in g["rows"]), key=lambda r: (r["step"], r["rank"])
    )
    write_steps_csv(run_dir, all_rows)
    created = _created_at(run_dir)
    metrics, warnings = _run_metrics(
        gathered,
        all_rows,
        model=model_metrics(model, inner=unwrap_model(model)),
        epoch_times=epoch_times,
        start=start,
    )
    record = run_record(
        cfg,
        ctx.plan,
        status="ok",
        threads_per_rank=threads,
        created_at=created,
        metrics=metrics,
        evals={
            "epochs": evals,
            "best": best_epoch(evals),
            "note": eval_note,
            "split_samples": workload.test_samples,  # what --eval-batches capped (epochs: samples)
        },
        workload=workload,
        traces=sorted(t for g in gathered for t in g["traces"]),
    )
    record["warnings"] = warnings  # e.g. no unprofiled measured step: throughput fell back
    record["env"]["host_load"] = inst.host.result  # rank 0's host (profiler.runfolder.hostload)
    if restarts:  # earlier attempts' traces too (their names say which attempt)
        record.update(faults.restart_record(run_dir, restarts), traces=faults.all_traces(run_dir))
    print(f"[rank0] wrote {write_run_json(run_dir, record)}", flush=True)


def _created_at(run_dir: Path) -> str | None:
    """`created_at` of the launcher's `running` record, kept in rank 0's; None when the trainer
    was started without the launcher (no record yet)."""
    try:
        rec, _ = read_record(run_dir / RUN_JSON)
    except InputError:
        return None
    return rec.created_at
