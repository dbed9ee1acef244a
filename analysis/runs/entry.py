"""One run folder -> one run entry of the runs JSON (docs/reference/metrics.md), before the cross-run
fields (baseline, speedup, groups) that analysis.runs.compare fills in.

Kept apart from the comparison because `analysis ops` / `analysis diff` (analysis.runs.opdiff) load
single runs through the same `load_run`: one validated reading of run.json and steps.csv,
whoever asks.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path, PurePath
from typing import Any

import msgspec

from analysis.errors import unexpected
from analysis.runs.family import family_fields
from analysis.runs.fields import (
    args_text,
    device_type,
    fixed_batch,
    mean_std,
    memory_peaks,
    num_devices,
    one_node_host,
)
from analysis.runs.notes import advice, overhead_note, workload_label
from analysis.runs.quiet import apply_quiet, mark_noisy, phases_summary
from analysis.trace.consistency import run_trace_warnings
from analysis.trace.folder import analyze_trace_dir
from analysis.trace.memory import breakdown_entries, fill_dynamic
from profiler.runfolder.errors import InputError, safe_text
from profiler.runfolder.hostload import QUIET_OTHER_CORES_FRAC
from profiler.runfolder.lease import killed_error
from profiler.runfolder.quiet import cores_in_use
from profiler.runfolder.records import InvalidRecord, read_record
from profiler.runfolder.schema import EvalEntry, Metrics, RunRecord, StepTime
from profiler.runfolder.steps import read_steps_frame

__all__ = [
    "MEASURED",
    "RunEntry",
    "args_text",
    "attach_trace",
    "is_measured",
    "load_run",
    "mean_std",
]

MEASURED = ("ok", "interrupted")
"""Statuses whose numbers count: a run stopped by a signal keeps what it measured."""

# The config/env fields copied verbatim into each run entry.
CONFIG_FIELDS = (
    "mode",
    "backend",
    "world_size",
    "model",
    "dataset",
    "scaling",
    "global_batch",
    "per_device_batch",
    "seed",
    "amp",
    "devices",
    "sweep_id",
    "workload",
    "repeat_id",
    "repeat_round",
)
ENV_FIELDS = (
    "os",
    "platform",
    "hostname",
    "python",
    "torch",
    "cuda",
    "nccl",
    "gpus",
    "cpu_model",
    "threads_per_rank",
)


class RunEntry(msgspec.Struct, kw_only=True):
    """One run entry of the runs JSON (docs/reference/metrics.md "runs JSON"; definitions §7), in its
    field order. `load_run` fills what one folder says; `attach_trace` the trace fields;
    analysis.runs.compare the cross-run ones (baseline, speedup, scaling efficiency), then writes
    it out as a dict (`msgspec.structs.asdict`)."""

    run_id: str = ""
    path: str = ""
    status: str = ""  # run.json status: ok | failed | skipped | running | interrupted
    error: dict[str, Any] | None = None
    mode: str | None = None
    backend: str | None = None
    world_size: int | None = None
    model: str | None = None
    dataset: str | None = None
    scaling: str | None = None
    global_batch: int | None = None
    per_device_batch: int | None = None
    seed: int | None = None
    amp: str | None = None  # none | fp16 | bf16
    devices: list[str] | None = None
    sweep_id: str | None = None
    workload: str | None = None  # a script run's problem (its hash and arguments, or --workload)
    repeat_id: str | None = None  # `--repeat` rounds: the set and this run's round (from 0)
    repeat_round: int | None = None
    script: str | None = None  # a script run's file name
    workload_label: str = ""  # analysis.runs.notes.workload_label: the caption
    stop_reason: str | None = None  # run.json stop_reason (--max-steps)
    advice: dict[str, str] = {}  # analysis.runs.notes.advice
    os: str | None = None
    platform: str | None = None
    hostname: str | None = None
    python: str | None = None
    torch: str | None = None
    cuda: str | None = None
    nccl: str | None = None
    gpus: Any = None
    cpu_model: str | None = None
    threads_per_rank: int | None = None
    host_load: dict[str, Any] | None = None  # env.host_load as run.json has it (busy machine)
    # The data-parallel family (analysis.runs.family.family_fields): zero, fsdp, strategy,
    # metrics.fsdp's groups and what bounds a rank's memory.
    zero: int | None = None
    fsdp: dict[str, Any] | None = None
    strategy: str | None = None
    fsdp_groups: list[dict[str, Any]] = []
    device_memory_bytes: int | None = None
    nproc_per_node: int | None = None
    # The rest of the same-workload key (WORKLOAD_KEY): the factories' arguments (args_text) and
    # the loss spec; a record from before them counts as no arguments and cross_entropy.
    model_args: str = ""
    dataset_args: str = ""
    loss: str = "cross_entropy"
    parameters: int | None = None  # config.model_facts.parameters: tied weights once
    fixed_batch: int | None = None  # the batch the scaling mode holds fixed (WORKLOAD_KEY)
    device_type: str | None = None
    num_devices: int | None = None
    # The headline throughput: over the quiet steps when `throughput_basis` is quiet; beside it
    # (analysis.runs.quiet) the all-steps and quiet-step figures and what the choice stands on.
    samples_per_s: float | None = None
    samples_per_s_all: float | None = None
    samples_per_s_quiet: float | None = None
    quiet_steps: int | None = None
    busy_steps: int | None = None
    quiet_threshold_cores: float | None = None
    throughput_basis: str | None = None  # quiet | all (null: a run without numbers)
    host_contention_frac: float | None = None
    throughput_noisy: bool = False
    step_time_s_mean: float | None = None
    step_time_s_p95: float | None = None
    wall_time_s: float | None = None
    profiler_overhead_pct: float | None = None
    # metrics.profiler_overhead_noise_pct and, from both, analysis.runs.notes.overhead_note
    profiler_overhead_noise_pct: float | None = None
    profiler_overhead_within_noise: bool | None = None
    profiler_overhead_note: str | None = None
    profile_export_s: float | None = None  # the slowest rank's trace export (metrics.profile)
    # The fewest measured (unprofiled) steps of any rank: what throughput was averaged over.
    measured_steps: int | None = None
    epoch_time_s: float | None = None  # wall time of each epoch's loop as run, mean over epochs
    baseline_run_id: str | None = None
    # analysis.runs.compare: same_seed | group_mean | self, the single runs behind it, the
    # throughput the speedup divides by and those runs' spread (the noise of a speedup)
    baseline_kind: str | None = None
    baseline_run_ids: list[str] = []
    baseline_samples_per_s: float | None = None
    baseline_noise_pct: float | None = None
    speedup: float | None = None
    scaling_efficiency: float | None = None
    phases_s: dict[str, float | None] | None = None  # a non-finite mean is null
    phases_per_rank_s: list[dict[str, Any]] = []  # {rank, <phase>: s, step_time: s}
    comm_pct: float | None = None
    exposed_comm_pct: float | None = None
    overlap_pct: float | None = None
    # analysis.runs.efficiency: the lost efficiency points split (DDP runs with a baseline)
    efficiency_loss_pts: dict[str, float | None] | None = None
    memory: list[dict[str, Any]] = []  # verbatim (validated): fields newer writers add pass through
    memory_metric: str | None = None
    peak_memory_bytes: int | None = None
    memory_imbalance_pct: float | None = None
    memory_imbalance_max_over_mean: float | None = None
    memory_breakdown: list[dict[str, Any]] = []
    test_loss: float | None = None
    top1_pct: float | None = None
    top5_pct: float | None = None
    perplexity: float | None = None  # sequence outputs: exp(mean token cross-entropy)
    eval_note: str | None = None  # run.json eval.note: why the run has no eval
    trace_files: list[str] = []
    traces_left_out: list[dict[str, str]] = []  # run.json traces_left_out: {file, reason}
    logs: list[str] = []
    trace: dict[str, Any] | None = None  # the traces JSON of traces/
    warnings: list[str] = []


def is_measured(run: RunEntry | dict[str, Any]) -> bool:
    """Whether a run's numbers count (MEASURED): ok, or interrupted with what it had."""
    status = run.get("status") if isinstance(run, dict) else run.status
    return status in MEASURED


def _measured_steps(metrics: Metrics) -> int | None:
    """The fewest measured (unprofiled) steps of any rank, None when no rank says."""
    return min((r.steps for r in metrics.per_rank if r.steps is not None), default=None)


def load_run(run_dir: Path, *, quiet_frac: float = QUIET_OTHER_CORES_FRAC) -> RunEntry:
    """One run entry of the runs JSON, without the cross-run fields (baseline, speedup, ...).

    run.json and steps.csv are validated first (profiler/runfolder/records.py). Raises InputError when
    run.json is missing or unreadable and InvalidRecord when either file breaks the run-folder
    contract; a missing steps.csv (or a bad one in a run that did not finish ok) or bad traces
    only add a line to the entry's `warnings`. `quiet_frac`: the quiet-step threshold, other
    processes' cores per core the run uses (analysis.runs.quiet).
    """
    rec, raw = read_record(run_dir / "run.json")
    status, error = rec.status, raw.get("error")
    if status == "running" and (killed := killed_error(run_dir)):  # its launcher is gone
        status, error = "failed", killed
    config, env, metrics = rec.config, rec.env, rec.metrics
    step_time = metrics.step_time_s or StepTime()
    best = rec.eval.best or EvalEntry()
    memory = (raw.get("metrics") or {}).get("memory") or []
    entry = RunEntry(
        run_id=safe_text(rec.run_id or run_dir.name),  # a non-UTF-8 folder name: U+FFFD
        path=str(run_dir),
        status=status,
        error=error,
        **{k: getattr(config, k) for k in CONFIG_FIELDS},
        **{k: getattr(env, k) for k in ENV_FIELDS},
        model_args=args_text(config.model_args),
        dataset_args=args_text(config.dataset_args),
        loss=config.loss or "cross_entropy",
        parameters=config.model_facts.parameters if config.model_facts else None,
        fixed_batch=fixed_batch(config),
        device_type=device_type(config),
        num_devices=num_devices(config),
        samples_per_s=metrics.samples_per_s,
        samples_per_s_all=metrics.samples_per_s,
        step_time_s_mean=step_time.mean,
        step_time_s_p95=step_time.p95,
        wall_time_s=metrics.wall_time_s,
        profiler_overhead_pct=metrics.profiler_overhead_pct,
        profiler_overhead_noise_pct=metrics.profiler_overhead_noise_pct,
        profile_export_s=max((p.export_s or 0.0 for p in metrics.profile), default=None),
        measured_steps=_measured_steps(metrics),
        host_load=msgspec.to_builtins(env.host_load) if env.host_load else None,
        **family_fields(config, metrics, env),
        epoch_time_s=mean_std(metrics.epoch_time_s)[0],
        memory=memory,
        **memory_peaks(memory),
        memory_breakdown=breakdown_entries((raw.get("metrics") or {}).get("memory_breakdown")),
        test_loss=best.test_loss,
        top1_pct=best.top1_pct,
        top5_pct=best.top5_pct,
        perplexity=best.perplexity,
        eval_note=rec.eval.note,
        trace_files=[],
        logs=sorted(p.relative_to(run_dir).as_posix() for p in run_dir.glob("logs/*.log")),
        warnings=[w for w in rec.warnings if w],  # the writer's own (e.g. no unprofiled step)
    )
    _words(entry, rec, raw)
    entry.trace_files = _inside_files(run_dir, rec.traces, entry.warnings)
    _read_phases(entry, run_dir / "steps.csv", rec, quiet_frac)
    mark_noisy(entry, measured=is_measured(entry))
    return entry


def _words(entry: RunEntry, rec: RunRecord, raw: dict) -> None:
    """The entry's caption, stop reason, overhead note and advice (analysis.runs.notes)."""
    config = rec.config
    entry.script = PurePath(config.script).name if config.script else None
    entry.workload_label = workload_label(config, raw.get("config") or {})
    entry.stop_reason = safe_text(rec.stop_reason) if rec.stop_reason else None
    entry.profiler_overhead_within_noise, entry.profiler_overhead_note = overhead_note(
        entry.profiler_overhead_pct, entry.profiler_overhead_noise_pct
    )
    ddp = rec.metrics.ddp
    entry.advice = advice(script=entry.script, num_buckets=ddp.num_buckets if ddp else None)
    left = {t.file: t.reason for t in rec.traces_left_out}
    inside = _inside_files(Path(entry.path), list(left), entry.warnings)
    entry.traces_left_out = [{"file": f, "reason": safe_text(left[f])} for f in inside]


def _inside_files(run_dir: Path, names: list[str], warnings: list[str]) -> list[str]:
    """run.json `traces` entries that name a file inside the run folder (links resolved): the
    report links only those; any other (`/etc/passwd`, `../../x`, a NUL) is one warning."""
    root, keep = run_dir.resolve(), []
    for name in names:
        try:
            inside = "\0" not in name and root in (run_dir / name).resolve().parents
        except (OSError, ValueError, RuntimeError):  # a link loop
            inside = False
        if inside:
            keep.append(name)
        else:
            warnings.append(
                f"{run_dir / 'run.json'}: `traces` entry {name[:200]!r} is not a file inside the "
                "run folder — not linked"
            )
    return keep


def _read_phases(entry: RunEntry, steps_csv: Path, rec: RunRecord, quiet_frac: float) -> None:
    """Fill the entry's quiet-step fields and phases from steps.csv (decoded once and validated,
    ranks against config.world_size; phases on the headline's steps); a missing file, or a bad
    one in a run that did not finish ok, is a warning; a bad one in an ok run raises
    InvalidRecord."""
    if not os.path.lexists(steps_csv):
        if is_measured(entry):
            entry.warnings.append(f"{steps_csv}: missing — phases left empty")
        return
    try:
        steps = read_steps_frame(steps_csv, world_size=entry.world_size)
    except InputError as err:
        if entry.status == "ok":
            raise (
                err
                if isinstance(err, InvalidRecord)
                else InvalidRecord(steps_csv, "", err.what, err.fix)
            ) from None
        # A run that did not finish may have been cut off mid-row: its numbers are not used.
        entry.warnings.append(f"{err} — phases left empty")
        return
    mask = apply_quiet(
        entry, steps, cores=cores_in_use(rec), frac=quiet_frac, measured=is_measured(entry)
    )
    entry.phases_s, entry.phases_per_rank_s, warning = phases_summary(steps, mask)
    if warning and warning not in entry.warnings:  # the writer's, said once
        entry.warnings.append(warning)
    if "profiled" not in steps.columns and entry.status == "ok":
        entry.warnings.append(
            f"{steps_csv}: no `profiled` column (run-folder schema "
            f"{rec.schema_version}) — throughput and phases include the "
            "profiled steps; re-run with the current dpscope to exclude them"
        )


def attach_trace(
    entry: RunEntry, run_dir: Path, *, progress: bool, clock_align: str = "auto"
) -> None:
    """Analyse the run's traces/ folder (clocks aligned per `clock_align`) and copy the
    run-level trace metrics into `entry`."""
    trace_dir = run_dir / "traces"
    if os.path.lexists(trace_dir) and not trace_dir.is_dir():
        entry.warnings.append(f"{trace_dir}: not a folder — its traces are not analysed")
        return
    if not trace_dir.is_dir() or not any(trace_dir.iterdir()):
        return
    left_out = frozenset(run_dir / t["file"] for t in entry.traces_left_out)
    try:
        host = one_node_host(read_record(run_dir / "run.json")[0])
        trace = analyze_trace_dir(
            trace_dir, progress=progress, exclude=left_out, clock_align=clock_align, host=host
        )
    except InputError as err:
        entry.warnings.append(str(err))
        return
    except Exception as err:  # noqa: BLE001 — the run's record stays; only its traces are lost
        entry.warnings.append(f"{trace_dir}: {unexpected(err)}")
        return
    entry.trace = trace
    entry.warnings += [f"{s['file']}: {s['reason']}" for s in trace["skipped"]]
    entry.warnings += run_trace_warnings(
        run_dir,
        world_size=entry.world_size,
        listed=entry.trace_files,
        trace=trace,
        left_out={t["file"]: t["reason"] for t in entry.traces_left_out},
    )
    entry.warnings += [
        f"{r['file']}: dropped {r['dropped_events']} event(s) with impossible times — not analysed"
        for r in trace["ranks"]
        if r.get("dropped_events")
    ]
    entry.warnings += [
        f"{r['file']}: {r['orphan_kernels']} GPU event(s) with no launch in the trace (queued"
        " before the profiler started?) — left out of the figures, as HTA does"
        for r in trace["ranks"]
        if r.get("orphan_kernels")
    ]
    entry.warnings += fill_dynamic(entry.memory_breakdown, trace["ranks"])
    ranks = [r for r in trace["ranks"] if r["step_time_us_mean"]]
    if ranks:
        entry.comm_pct = statistics.fmean(
            100 * r["comm_us"] / r["step_time_us_mean"] for r in ranks
        )
        entry.exposed_comm_pct = statistics.fmean(
            100 * r["exposed_comm_us"] / r["step_time_us_mean"] for r in ranks
        )
        overlaps = [r["overlap_pct"] for r in ranks if r["overlap_pct"] is not None]
        entry.overlap_pct = statistics.fmean(overlaps) if overlaps else None
