"""A training run's projection inputs (`analysis project`): its unprofiled step phases, DDP
buckets, buffer broadcasts and, for a DDP run, the exposed communication its traces measured (taken
out of backward, so compute is compute), and its traced per-bucket calls for the self-replay.
Definitions: docs/reference/metrics.md §10.

A run whose measured times cannot describe a step (non-finite, negative, or a step under
MIN_STEP_S, such as the subnormal 1e-320 s of a damaged steps.csv) is refused with one line
("cannot project"), never projected into infinities."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.project.comm import is_comm_run
from analysis.project.model import FIRST_BUCKET_BYTES, ProjectionInputs, ddp_buckets
from analysis.project.traced import bucket_calls, exposed_share, read_rank_rows
from profiler.runfolder.errors import InputError, safe_text
from profiler.runfolder.layout import RUN_JSON, STEP_PHASES, STEPS_CSV, throughput_steps
from profiler.runfolder.records import read_record
from profiler.runfolder.schema import Config, Metrics, ProfileConfig, RunRecord
from profiler.runfolder.steps import read_steps_frame

__all__ = [
    "MAX_STEP_S",
    "MIN_STEP_S",
    "ProjectionInputs",
    "load_training",
    "measured_steps",
    "unprofiled_steps",
]

MIN_STEP_S, MAX_STEP_S = 1e-6, 86400.0
"""The mean step the projection accepts: from 1 µs to 1 day. No training step is shorter or
longer, so one outside (0, a subnormal 1e-320 s, or 1e308 s whose mean overflows) is a damaged
record, not a measurement."""


def _profiled_from_schedule(steps: pd.Series, profile: ProfileConfig | None) -> pd.Series:
    """Steps the profiler was on for (its warm-up and active steps), from config.profile."""
    if profile is None or not profile.enabled:
        return pd.Series(False, index=steps.index)
    wait, warm, active = profile.wait, profile.warmup, profile.active
    cycle = max(1, wait + warm + active)
    repeat = profile.repeat
    in_cycles = (steps // cycle < repeat) if repeat > 0 else pd.Series(True, index=steps.index)
    return in_cycles & (steps % cycle >= wait)


def measured_steps(steps: pd.DataFrame, config: Config) -> tuple[pd.DataFrame, str | None]:
    """The steps the projection measures on and the warning of the rule's fallback: the
    run-folder rule (profiler.runfolder.layout.throughput_steps: non-warm-up steps the profiler did not
    record, else every non-warm-up step, with its warning), applied to steps.csv `profiled` when
    present, else to the flags derived from config.profile's schedule (wait, warmup, active,
    repeat)."""
    if "profiled" in steps.columns:
        profiled = steps["profiled"].fillna(0).astype(int) == 1
    else:
        profiled = _profiled_from_schedule(steps["step"], config.profile)
    mask, warning = throughput_steps(steps["warmup"], profiled.astype(int))
    return steps[mask], warning


def unprofiled_steps(steps: pd.DataFrame, config: Config) -> pd.DataFrame:
    """The rows of `measured_steps`, without its warning."""
    return measured_steps(steps, config)[0]


def _training_record(run_dir: Path) -> tuple[RunRecord, dict]:
    """The run's validated run.json; InputError unless it is a finished single/DDP training."""
    if is_comm_run(run_dir):
        raise InputError(run_dir, "is a comm benchmark, not a training run", "pass it as --comm")
    rec, raw = read_record(run_dir / RUN_JSON)  # one line when missing or invalid
    if rec.config.mode not in ("single", "ddp"):
        raise InputError(
            run_dir, "is not a single-device or DDP training run", "pass one made by make profile-*"
        )
    if rec.status != "ok":
        raise InputError(run_dir, f"status is {rec.status!r}", "pass a finished (ok) run")
    return rec, raw


def _measured_body(run_dir: Path, config: Config) -> tuple[pd.DataFrame, str | None]:
    """steps.csv's rows the rule measures on (the typed reader's frame, ranks checked against
    config.world_size), and its fallback warning; one line when none."""
    steps = read_steps_frame(run_dir / STEPS_CSV, world_size=config.world_size)
    body, fallback = measured_steps(steps, config)
    if body.empty:
        raise InputError(
            run_dir / STEPS_CSV,
            "has no measured step (every step was a warm-up step)",
            "re-run with more --max-steps than --warmup-steps",
        )
    _check_times(run_dir / STEPS_CSV, body)
    return body, fallback


def _check_times(path: Path, body: pd.DataFrame) -> None:
    """One line (InputError) unless the measured rows describe a real step: finite,
    non-negative times and a mean step and phases from MIN_STEP_S to MAX_STEP_S."""
    cols = ["step_time_s", *(f"{p}_s" for p in STEP_PHASES)]
    values = body[cols].to_numpy(dtype=float)
    with np.errstate(over="ignore"):  # an overflowing mean is what this check is for
        means = values.mean(axis=0)
    ok = (np.isfinite(values) & (values >= 0)).all(axis=0) & (means <= MAX_STEP_S)
    bad = [c for c, good in zip(cols, ok, strict=True) if not good]
    step = float(means[0])
    if bad or not step >= MIN_STEP_S:
        what = (f"a non-finite, negative or over-a-day {', '.join(bad)}" if bad
                else f"a mean step of {step:.3g} s (under {MIN_STEP_S:g} s)")  # fmt: skip
        raise InputError(
            path,
            f"cannot project: its measured steps have {what}, not a real step time",
            "re-run the training; the projection needs real step times",
        )


def _buckets(run_json: Path, config: Config, metrics: Metrics) -> tuple[list[int], str]:
    """DDP's gradient buckets (bytes, gradient-ready order) and where they came from."""
    if metrics.ddp is not None and metrics.ddp.bucket_sizes_bytes:
        return list(metrics.ddp.bucket_sizes_bytes), "metrics.ddp"
    if metrics.param_grad_bytes:
        cap = (config.ddp.bucket_cap_mb if config.ddp else None) or 25.0
        # Records from before first_bucket_bytes existed ran a torch with the 1 MiB first bucket.
        first = (config.ddp.first_bucket_bytes if config.ddp else None) or FIRST_BUCKET_BYTES
        return (
            ddp_buckets(metrics.param_grad_bytes, cap, first),
            f"computed from metrics.param_grad_bytes, bucket_cap_mb {cap:g}, first bucket "
            f"{first / 2**20:g} MiB",
        )
    raise InputError(
        run_json,
        "has neither metrics.ddp bucket sizes nor metrics.param_grad_bytes",
        "re-run it with the current trainer",
    )


def load_training(
    run_dir: Path, *, traces: bool = True, trace: dict | None = None
) -> ProjectionInputs:
    """A training run's projection inputs; InputError (one line) when it cannot be projected.

    A DDP run's traces are analysed for its exposed communication (`traces=False`: not read;
    `trace`: an already computed traces JSON of this run)."""
    run_dir = Path(run_dir)
    rec, _ = _training_record(run_dir)
    config, metrics = rec.config, rec.metrics
    body, fallback = _measured_body(run_dir, config)
    phases = {p: float(body[f"{p}_s"].mean()) for p in STEP_PHASES}
    step = float(body["step_time_s"].mean())
    buckets, source = _buckets(run_dir / RUN_JSON, config, metrics)
    run = ProjectionInputs(
        run_id=safe_text(rec.run_id or run_dir.name),
        path=str(run_dir),
        mode=rec.config.mode,
        backend=rec.config.backend,
        world_size=int(rec.config.world_size or 1),
        model=rec.config.model,
        dataset=rec.config.dataset,
        scaling=config.scaling or "strong",
        per_device_batch=int(rec.config.per_device_batch or 1),
        global_batch=int(rec.config.global_batch or 1),
        comm_hook=(config.ddp.comm_hook if config.ddp else None) or "none",
        threads_per_rank=rec.env.threads_per_rank,
        steps_used=int(body["step"].nunique()),
        step_time_s=step,
        phases_s=phases,
        other_s=max(0.0, step - sum(phases.values())),
        step_samples_s=body["step_time_s"].to_numpy(dtype=float),
        buckets_bytes=buckets,
        bucket_source=source,
        buffer_groups_bytes=_buffer_groups(metrics),
        backward_compute_s=phases["backward"],
        warnings=[fallback] if fallback else [],
    )
    if run.mode == "ddp" and run.world_size > 1:
        if traces:
            _subtract_traced_comm(run, run_dir, trace)
        else:
            run.warnings.append(
                "traces not read: backward taken as all compute (incl. its comm wait)"
            )
    run.compute_s = step - phases["backward"] + run.backward_compute_s
    return run


def _buffer_groups(metrics: Metrics) -> list[int]:
    """Bytes of each buffer broadcast DDP makes per forward (broadcast_buffers, torch's default):
    one coalesced broadcast per dtype of the module's buffers (metrics.buffer_bytes_by_dtype);
    runs from before that field: the memory breakdown's buffers_bytes as one broadcast."""
    if metrics.buffer_bytes_by_dtype is not None:
        return [b for b in metrics.buffer_bytes_by_dtype.values() if b > 0]
    first = metrics.memory_breakdown[0] if metrics.memory_breakdown else {}
    nbytes = first.get("buffers_bytes") or 0
    ok = isinstance(nbytes, int | float) and not isinstance(nbytes, bool)
    return [int(nbytes)] if ok and 0 < nbytes < float("inf") else []


def _subtract_traced_comm(run: ProjectionInputs, run_dir: Path, trace: dict | None) -> None:
    """A DDP run's backward includes waiting for its all-reduces; take out the exposed part the
    traces measured for the rank that arrives last (analysis.project.traced: the others' extra
    wait is rank skew, which stays in compute as the step's own straggler time), so
    compute is what sets the step (the replay then re-adds the *modelled* exposure). Without a
    given traces JSON the traces are read here, and their per-bucket calls kept for the
    self-replay (`traced_calls`)."""
    try:
        ranks = trace["ranks"] if trace is not None else read_rank_rows(run_dir / "traces")
    except InputError as err:
        run.warnings.append(f"{err} — backward taken as all compute")
        return
    if trace is None:
        run.traced_calls = bucket_calls(ranks, len(run.buckets_bytes))
    share = (run.traced_calls or {}).get("exposed_share")
    share = exposed_share(ranks) if share is None else share
    if share is None:
        run.warnings.append("traces have no comm — backward taken as all compute")
        return
    # Profiled steps run slower than the unprofiled ones used here, so the traced exposed comm is
    # taken as a share of the traced step and scaled to the measured step (as the report does).
    run.exposed_share = share
    run.traced_exposed_comm_s = share * run.step_time_s
    run.step_samples_s = run.step_samples_s * (1 - share)
    bwd = run.phases_s["backward"]
    run.backward_compute_s = max(0.1 * bwd, bwd - run.traced_exposed_comm_s)
    if run.backward_compute_s == 0.1 * bwd:
        run.warnings.append(
            "traced exposed comm exceeds 90% of backward: backward compute floored at 10%"
        )
