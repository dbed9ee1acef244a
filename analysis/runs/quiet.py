"""The steps a run entry's numbers are measured on: quiet steps in the runs JSON (each run's
throughput over the steps measured while other processes left the machine alone, and which figure
its headline `samples_per_s` is: docs/reference/metrics.md, "Quiet steps"; the rule itself:
profiler.runfolder.quiet), and the phases over the headline's steps (`phases_summary`).

Fields of a run entry (analysis.runs.entry.RunEntry):
- `samples_per_s_all` (samples/s): over every throughput step, run.json `metrics.samples_per_s`;
- `samples_per_s_quiet` (samples/s): over the quiet steps (null without one);
- `quiet_steps`, `busy_steps`: throughput steps at or below / above `quiet_threshold_cores`
  (cores: QUIET_OTHER_CORES_FRAC, or `--quiet-threshold`, × the cores the run uses); both null
  for a run without steps.csv `other_cpu_cores` (older runs);
- `throughput_basis`: `quiet` when at least MIN_QUIET_STEPS steps were quiet (then
  `samples_per_s`, and so speedup, efficiency and the phases, are over the quiet steps), else `all`;
- `host_contention_frac`: the share of the headline's step time the busy steps added over the
  quiet pace (profiler.runfolder.quiet), what "where the efficiency went" names host contention;
- `throughput_noisy`: the headline is known to be noise: it is the all-steps figure and steps
  were measured busy (or the whole run was, profiler.runfolder.hostload.is_busy).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from profiler.runfolder.hostload import QUIET_OTHER_CORES_FRAC, is_busy
from profiler.runfolder.layout import STEP_PHASES, throughput_steps
from profiler.runfolder.quiet import MIN_QUIET_STEPS, quiet_summary

if TYPE_CHECKING:
    from analysis.runs.entry import RunEntry

# Statuses whose numbers count (analysis.runs.entry.MEASURED, which imports this module).
MEASURED = ("ok", "interrupted")

__all__ = ["add_quiet_argument", "apply_quiet", "mark_noisy", "phases_summary"]


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1000:  # NaN fails too
        raise argparse.ArgumentTypeError(
            f"give other processes' cores per core a run uses, e.g. 0.25; got {text!r}"
        )
    return value


def add_quiet_argument(parser: argparse.ArgumentParser) -> None:
    """`--quiet-threshold FRAC` of `dpscope runs` and `dpscope report` (dest `quiet_frac`)."""
    parser.add_argument(
        "--quiet-threshold",
        dest="quiet_frac",
        type=_fraction,
        default=QUIET_OTHER_CORES_FRAC,
        metavar="FRAC",
        help="a step is quiet when other processes used at most FRAC cores per core the run "
        f"uses (default {QUIET_OTHER_CORES_FRAC}); the headline uses the quiet steps when at "
        f"least {MIN_QUIET_STEPS} were quiet",
    )


def apply_quiet(
    entry: RunEntry, steps: pd.DataFrame, *, cores: int | None, frac: float, measured: bool
) -> np.ndarray:
    """Fill `entry`'s quiet-step fields from its steps.csv frame (its headline too when
    `measured`: its numbers count); return the rows its headline is measured on (the phases
    use the same rows)."""
    q = quiet_summary(steps, cores=cores, frac=frac)
    entry.quiet_threshold_cores = q["quiet_threshold_cores"]
    entry.quiet_steps, entry.busy_steps = q["quiet_steps"], q["busy_steps"]
    entry.samples_per_s_quiet = q["samples_per_s_quiet"]
    entry.host_contention_frac = q["host_contention_frac"]
    if measured:
        entry.throughput_basis = q["throughput_basis"]
        if q["throughput_basis"] == "quiet":
            entry.samples_per_s = q["samples_per_s_quiet"]
    return q["mask"]


def mark_noisy(entry: RunEntry, *, measured: bool) -> None:
    """`throughput_noisy`: an all-steps headline with busy steps in it, or a busy run's (a
    `measured` run without steps.csv has the all-steps headline too)."""
    if measured and entry.throughput_basis is None:
        entry.throughput_basis = "all"
    entry.throughput_noisy = entry.throughput_basis == "all" and (
        bool(entry.busy_steps) or is_busy(entry.host_load)
    )


def phases_summary(
    steps: pd.DataFrame, rows: np.ndarray | None = None
) -> tuple[dict | None, list[dict], str | None]:
    """Mean seconds per step of each phase, over all ranks and per rank, on the steps throughput
    uses (profiler.runfolder.layout.throughput_steps: neither warm-up nor profiled, else every measured
    step with its warning; schema 1 folders have no `profiled` column: every non-warm-up step),
    or on `rows` (a mask: the headline's quiet steps), and the rule's warning. (None, [], None)
    without a measured step."""
    profiled = steps["profiled"] if "profiled" in steps.columns else None
    mask, warning = throughput_steps(steps["warmup"], profiled)
    body = steps[mask if rows is None else rows]
    if body.empty:
        return None, [], None
    cols = [f"{p}_s" for p in STEP_PHASES]
    overall = {p: float(body[f"{p}_s"].mean()) for p in STEP_PHASES}
    per_rank = body.groupby("rank")[[*cols, "step_time_s"]].mean().reset_index()
    rows = [
        {
            "rank": int(r["rank"]),
            **{p: float(r[f"{p}_s"]) for p in STEP_PHASES},
            "step_time": float(r["step_time_s"]),
        }
        for r in per_rank.to_dict("records")
    ]
    return overall, rows, warning
