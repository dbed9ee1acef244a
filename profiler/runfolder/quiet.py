"""The quiet-step rule: throughput over the steps measured while other processes left the machine
alone, and which figure a run's headline uses (docs/reference/metrics.md, "Quiet steps").

- A step is *quiet* when steps.csv `other_cpu_cores` (the most any row of that step recorded;
  rank 0 measures for its host), and that of every later step ending less than the meter's
  window (0.2 s) after it (their windows reach back into this step: a burst that began late in
  this step shows there first), is at most `frac` × the cores the run uses (`cores_in_use`);
  `frac` defaults to QUIET_OTHER_CORES_FRAC (0.25 of a core per core in use). A step without a
  value (other ranks' rows alone, a run from before the column) is neither quiet nor busy.
- Only the throughput steps count (profiler.runfolder.layout.throughput_steps: measured, not
  profiled), so quiet steps are a subset of what `samples_per_s` is measured on.
- `samples_per_s_quiet`: the samples of all ranks in the quiet steps ÷ the longest per-rank sum of
  those steps' `step_time_s`, the same formula as run.json `samples_per_s` (stepmetrics).
- The headline (`throughput_basis`) is the quiet figure when at least MIN_QUIET_STEPS steps are
  quiet, else the all-steps one.
- `host_contention_frac`: the share of the headline's step time that steps measured while other
  processes ran added over the quiet pace, 1 − samples_per_s(all) ÷ samples_per_s_quiet; 0 when the
  headline is the quiet figure (no busy step is in it), None without a quiet step to pace it.

Torch-free and in the contract package because the launcher's `--repeat auto` rounds and the
analysis both read a run's throughput through it, so the rounds stop on the number the report
shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiler.runfolder.hostload import QUIET_OTHER_CORES_FRAC, STEP_LOAD_WINDOW_S
from profiler.runfolder.layout import RUN_JSON, STEPS_CSV, throughput_steps
from profiler.runfolder.records import read_record
from profiler.runfolder.schema import RunRecord
from profiler.runfolder.steps import read_steps_frame

__all__ = [
    "LOAD_COLUMN",
    "MIN_QUIET_STEPS",
    "cores_in_use",
    "frame_samples_per_s",
    "quiet_summary",
    "run_headline",
]

LOAD_COLUMN = "other_cpu_cores"
# The headline uses the quiet-step throughput when at least this many steps were quiet (the
# report's "few steps" caveat uses the same count).
MIN_QUIET_STEPS = 8


def cores_in_use(record: RunRecord) -> int | None:
    """The cores a run uses on its host: its ranks there (`config.nproc_per_node`, else the world
    size for DDP, else 1) × `env.threads_per_rank`, at most the host's logical cores; None when
    the record names no core count."""
    env, config = record.env, record.config
    cores = (env.host_load.cores if env.host_load else None) or env.cpu_cores
    if not cores:
        return None
    ranks = config.nproc_per_node or (config.world_size if config.mode == "ddp" else 1) or 1
    threads = env.threads_per_rank or cores
    return max(1, min(cores, ranks * threads))


def frame_samples_per_s(steps: pd.DataFrame, mask: np.ndarray) -> float | None:
    """Samples of all ranks in the rows of `mask` ÷ the longest per-rank sum of their
    `step_time_s` (the slowest rank bounds the job); None without such a row or time."""
    rows = steps[mask]
    if rows.empty or "samples" not in rows.columns:
        return None
    busiest = float(rows.groupby("rank")["step_time_s"].sum().max())
    samples = float(rows["samples"].fillna(0).sum())
    return samples / busiest if busiest > 0 else None


MAX_STEP_END_S = 1e9
"""The latest step end the quiet rule's clock holds (31 years; pandas' timedelta ends at 292)."""


def _step_loads(steps: pd.DataFrame) -> pd.Series:
    """Each row's step load: the largest `other_cpu_cores` of every measurement that covers its
    step: the step's own (the most any row of it recorded) and that of each later step whose
    window reaches back into it. A step shorter than the meter's window (STEP_LOAD_WINDOW_S) is
    measured over the window ending with it, so a later step ending less than a window after
    this one's end covers this one too: a burst that began late in a step shows there first.
    (The steps' times are summed without the gaps between them: a little more look-ahead.)"""
    if LOAD_COLUMN not in steps.columns:
        return pd.Series(np.nan, index=steps.index)
    by_step = steps.groupby("step").agg(load=(LOAD_COLUMN, "max"), time=("step_time_s", "max"))
    # A time that is missing, negative or past any real run (a damaged steps.csv) must not break
    # the clock the window runs on: read as 0, or as MAX_STEP_END_S at most (timedelta's range).
    times = by_step["time"].to_numpy(dtype=float)
    times = np.clip(np.nan_to_num(times, nan=0.0, posinf=MAX_STEP_END_S, neginf=0.0), 0, None)
    with np.errstate(over="ignore"):
        ends = np.minimum(np.cumsum(np.minimum(times, MAX_STEP_END_S)), MAX_STEP_END_S)
    # Backwards in time, a rolling max over one window: at step k, the steps ending in
    # [end_k, end_k + window), i.e. k and the later ones whose windows reach back into it.
    back = pd.Series(by_step["load"].to_numpy()[::-1], index=pd.to_timedelta(-ends[::-1], unit="s"))
    covered = back.rolling(pd.Timedelta(seconds=STEP_LOAD_WINDOW_S)).max().to_numpy()[::-1]
    covered = np.where(np.isnan(by_step["load"].to_numpy()), np.nan, covered)  # own value needed
    return steps["step"].map(pd.Series(covered, index=by_step.index)).astype(float)


def quiet_summary(
    steps: pd.DataFrame,
    *,
    cores: int | None,
    frac: float = QUIET_OTHER_CORES_FRAC,
    min_steps: int = MIN_QUIET_STEPS,
) -> dict[str, Any]:
    """The quiet-step figures of one run's steps.csv frame (the module docstring); `cores` is
    `cores_in_use`. `mask` is the rows the headline is measured on (boolean array)."""
    profiled = steps["profiled"] if "profiled" in steps.columns else None
    measured, _ = throughput_steps(steps["warmup"], profiled)
    load = _step_loads(steps).to_numpy()
    threshold = frac * cores if cores else None
    known = measured & ~np.isnan(load)
    quiet = known & (load <= threshold) if threshold is not None else np.zeros_like(known)
    n_known = int(steps.loc[known, "step"].nunique())
    n_quiet = int(steps.loc[quiet, "step"].nunique())
    all_sps = frame_samples_per_s(steps, measured)
    quiet_sps = frame_samples_per_s(steps, quiet) if n_quiet else None
    basis = "quiet" if n_quiet >= min_steps and quiet_sps else "all"
    host = None
    if basis == "quiet":
        host = 0.0
    elif quiet_sps and all_sps:
        host = 1 - all_sps / quiet_sps
    return {
        "quiet_threshold_cores": threshold,
        "load_steps": n_known if threshold is not None else None,
        "quiet_steps": n_quiet if n_known and threshold is not None else None,
        "busy_steps": n_known - n_quiet if n_known and threshold is not None else None,
        "samples_per_s_quiet": quiet_sps,
        "throughput_basis": basis,
        "host_contention_frac": host,
        "mask": quiet if basis == "quiet" else measured,
    }


def run_headline(run_dir: Path, *, frac: float = QUIET_OTHER_CORES_FRAC) -> float | None:
    """A finished run folder's headline samples/s: the quiet-step figure when at least
    MIN_QUIET_STEPS steps were quiet, else run.json `metrics.samples_per_s`; None for a run that
    did not finish ok. Raises what the readers raise for a broken folder."""
    rec, _ = read_record(Path(run_dir) / RUN_JSON)
    if rec.status != "ok":
        return None
    steps = read_steps_frame(Path(run_dir) / STEPS_CSV, world_size=rec.config.world_size)
    summary = quiet_summary(steps, cores=cores_in_use(rec), frac=frac)
    if summary["throughput_basis"] == "quiet":
        return summary["samples_per_s_quiet"]
    return rec.metrics.samples_per_s
