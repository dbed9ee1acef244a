"""Analyse a folder of per-rank Kineto traces: the "traces JSON" (schema_version 2).

Each file is reduced to its rank summary in its own worker process (events never leave the
worker), then ranks are aligned on one clock and compared: collectives (transfer vs sync, algbw,
busbw), stragglers and step-time spread. A bad file costs one line in `skipped`, never the run.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from analysis.jsonsafe import finite_json
from analysis.progress import Bar
from analysis.trace.attribution import hta_filtered
from analysis.trace.cache import cache_enabled
from analysis.trace.calls import TracesResult, call_table
from analysis.trace.clocks import align_clocks, check_clock_align
from analysis.trace.crossrank import combine_collectives
from analysis.trace.executors import Executor, Outcome, process_summaries
from analysis.trace.rank import RankSummary
from profiler.runfolder.errors import InputError
from profiler.runfolder.versions import TRACES_JSON_SCHEMA_VERSION

__all__ = [
    "analyze_trace_dir",
    "combine_summaries",
    "find_trace_files",
    "reduce_files",
    "traces_row",
]

_RANK_FIELDS = (
    "rank",
    "file",
    "rank_source",
    "kind",
    "host",
    "steps",
    "dropped_events",
    "orphan_kernels",
    "orphan_kernel_us",
    "step_numbers",
    "step_time_us_mean",
    "compute_us",
    "comm_us",
    "exposed_comm_us",
    "exposed_comm_us_by_phase",
    "overlap_us",
    "data_wait_us",
    "idle_us",
    "overlap_pct",
    "idle_pct",
    "hta",
    "tb_split",
    "tb_split_steps",
    "tb_split_step_time_us_mean",
    "ops",
    "ops_self_us_per_step",
    "per_step",
    "memory",
    "warnings",
)


def find_trace_files(path: Path) -> list[Path]:
    """Kineto trace files (`*.json`, `*.json.gz`) under `path`, sorted; a file path is itself."""
    path = Path(path)
    if path.exists() and not path.is_dir():  # a FIFO or device too: the loader refuses it
        return [path]
    if not path.is_dir():
        raise InputError(path, "does not exist", "pass a folder of .pt.trace.json(.gz) files")
    # Not only regular files: a FIFO or device named like a trace gets its own `skipped` line
    # (the loader opens it non-blocking and refuses it) instead of vanishing.
    files = sorted(
        p
        for p in path.rglob("*")
        if (p.name.endswith(".json") or p.name.endswith(".json.gz")) and not p.is_dir()
    )
    if not files:
        raise InputError(
            path,
            "no trace files (*.json, *.json.gz)",
            "profile a run first or point at its traces/ folder",
        )
    return files


def traces_row(summary: RankSummary) -> dict:
    """The traces JSON's `ranks[]` row of a rank summary (its _RANK_FIELDS, in that order)."""
    return {k: getattr(summary, k) for k in _RANK_FIELDS}


def _summaries(files: list[Path], ex: Executor, progress: bool) -> Iterator[tuple[Path, Outcome]]:
    """(file, outcome) for every file, in completion order, with a progress bar."""
    if ex.kind == "dask":
        from analysis.trace.daskexec import check_executor, dask_summaries

        check_executor(ex)
        results = dask_summaries(files, ex)
    else:
        results = process_summaries(files, ex)
    show = progress and len(files) > 1
    with Bar(total=len(files), desc="traces", unit="file", disable=not show, leave=False) as bar:
        for item in results:
            yield item
            bar.update()


_ATTEMPT_RE = re.compile(r"_attempt(\d+)\.")


def _one_attempt(summaries: list[RankSummary], skipped: list[dict]) -> list[RankSummary]:
    """Keep the traces of one attempt of a restarted job (`rank<r>_attempt<k>.*`; no suffix is
    attempt 0): the attempt with the most ranks, the latest among equals. Two attempts may
    have traced the same steps, so mixing them would count a step twice."""
    attempts: dict[int, list[dict]] = {}
    for s in summaries:
        m = _ATTEMPT_RE.search(Path(s.file).name)
        attempts.setdefault(int(m.group(1)) if m else 0, []).append(s)
    if len(attempts) < 2:
        return summaries
    keep = max(attempts, key=lambda a: (len({s.rank for s in attempts[a]}), a))
    skipped += [
        {
            "file": s.file,
            "reason": f"restart attempt {a} of the job — attempt {keep}'s traces are analysed "
            "(one attempt, so no step counts twice)",
        }
        for a, ss in attempts.items()
        if a != keep
        for s in ss
    ]
    return attempts[keep]


def _assign_ranks(
    summaries: list[RankSummary], skipped: list[dict], warnings: list[str]
) -> list[RankSummary]:
    """Drop rank-less traces (unless alone) and later duplicates of a rank; never guess a rank."""
    if len(summaries) == 1 and summaries[0].rank is None:
        summaries[0].rank, summaries[0].rank_source = 0, "assumed (only trace)"
        warnings.append(
            f"{summaries[0].file}: no rank in distributedInfo or file name — "
            "treated as rank 0 since it is the only trace"
        )
    kept: dict[int, RankSummary] = {}
    for s in sorted(summaries, key=lambda s: s.file):
        if s.rank is None:
            warnings += s.warnings  # e.g. why its distributedInfo rank was not taken
            skipped.append(
                {
                    "file": s.file,
                    "reason": "no rank in distributedInfo or file name —"
                    " rename it rank<N>.pt.trace.json.gz or profile under a process group",
                }
            )
        elif s.rank in kept:
            skipped.append(
                {
                    "file": s.file,
                    "reason": f"duplicate rank {s.rank} (also in "
                    f"{kept[s.rank].file}) — keep one trace per rank in the folder",
                }
            )
        else:
            kept[s.rank] = s
    return [kept[r] for r in sorted(kept)]


def _mixed_job_warnings(path: Path, ranks: list[RankSummary], worlds: list[int]) -> list[str]:
    """Signs that one folder holds traces of different jobs: cross-rank numbers (collective
    matching, stragglers, step-time spread) then compare unrelated processes."""
    out = [
        f"{r.file}: rank {r.rank} is outside its world size {r.world_size} — "
        "keep one job's traces per folder"
        for r in ranks
        if r.world_size and r.rank >= r.world_size
    ]
    if len(set(worlds)) > 1:
        out.append(
            f"{path}: traces disagree on the world size ({', '.join(map(str, sorted(set(worlds))))})"
            " — keep one job's traces per folder"
        )
    return out


def _filter_warnings(ranks: list[RankSummary]) -> list[str]:
    """HTA decides its kernel filter over every rank's ProfilerStep names together (two or more:
    filter every rank). dpscope decides per rank (analysis.trace.attribution), so a rank with
    fewer than two steps in a folder holding two or more names is said: HTA would filter it
    (orphans and its last step out) where dpscope keeps every kernel of it."""
    names = {n for r in ranks for n in r.profiler_steps}
    if not hta_filtered(len(names)):
        return []
    return [
        f"{r.file}: {len(set(r.profiler_steps))} ProfilerStep(s) here but {len(names)} step "
        "names across the traces: HTA would filter this rank too (orphans and its last step "
        "out); dpscope analyses it with every kernel (keep one job's traces per folder)"
        for r in ranks
        if not hta_filtered(len(set(r.profiler_steps)))
    ]


def reduce_files(
    files: list[Path],
    *,
    workers: int | None = None,
    progress: bool = True,
    executor: Executor | None = None,
) -> tuple[list[RankSummary], list[dict]]:
    """Reduce each file to its rank summary where `executor` says (default: `workers` local
    processes, one per core): (summaries, skipped)."""
    ex = executor or Executor()
    ex = replace(ex, cache=cache_enabled(ex.cache))  # None: DPSCOPE_TRACE_CACHE=1 turns it on
    if ex.kind == "process":  # one per core unless told, never more than files
        ex = replace(ex, workers=max(1, min(workers or os.cpu_count() or 1, len(files) or 1)))
    skipped: list[dict] = []
    good: list[RankSummary] = []
    with _collector_paused():
        for f, (summary, error, lost) in _summaries(files, ex, progress):
            if error:
                skipped.append(
                    {"file": str(f), "reason": error, **({"worker_died": True} if lost else {})}
                )
            else:
                good.append(summary)
    return good, skipped


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's automatic garbage collection off while the summaries pile up, the caller's
    setting back after. Each full collection walks every summary kept so far, and one runs each
    time the kept objects grow by a quarter: ~25% of a 1,024-rank analysis in one process
    (34 -> 25.5 s). A 54 MB trace's reduction leaves ~300 objects in cycles, which wait for the
    next collection after this."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def analyze_trace_dir(
    path: Path,
    *,
    workers: int | None = None,
    progress: bool = True,
    executor: Executor | None = None,
    exclude: frozenset[Path] = frozenset(),
    clock_align: str = "auto",
    host: str | None = None,
) -> dict:
    """The traces JSON for every trace file in `path` but those in `exclude` (traces its run's
    record leaves out; see docs/reference/metrics.md for each field). `host`: the host of every
    rank whose trace names none (a one-node job's run.json `env.hostname`).

    Raises InputError when no file could be analysed; otherwise bad files are listed in
    `skipped` with a one-line reason and the rest is analysed. `executor`: where the per-rank
    reductions run (executors.Executor: local processes, or a Dask cluster; the trace cache).
    `clock_align` (off | auto | force) is analysis/trace/clocks.py's.
    """
    check_clock_align(clock_align)  # before any file is read
    files = [f for f in find_trace_files(path) if f not in exclude]
    if not files:
        raise InputError(path, "no trace files of this run", "profile the run again")
    good, skipped = reduce_files(files, workers=workers, progress=progress, executor=executor)
    return combine_summaries(path, good, skipped, clock_align=clock_align, host=host)


def _clock_fields(
    ranks: list[RankSummary], clock_align: str, warnings: list[str], host: str | None
) -> TracesResult:
    """Put every rank's instances on one origin (HTA's shift: the earliest event of all ranks
    is 0, exact integer ns), then estimate and remove the hosts' clock offsets
    (analysis/trace/clocks.py); returns {rank: its clock fields for `ranks[]`}."""
    origin = min(r.origin_ns for r in ranks)
    for r in ranks:
        shift_us = (r.origin_ns - origin) / 1000  # exact integer ns: no float64 absolute clock
        for inst in r.instances.values():
            inst["start_us"] = inst["start_us"] + shift_us
            if "end_us" in inst:  # absent in parts of older dpscope versions
                inst["end_us"] = inst["end_us"] + shift_us
    offsets, shifted, notes = align_clocks(
        {r.rank: r.instances for r in ranks},
        {r.rank: r.host or host for r in ranks},
        clock_align,
        {r.rank: r.clock_probe for r in ranks},
    )
    warnings += notes
    return {
        rank: {
            "clock_offset_us": off.offset_us if off else None,
            "clock_offset_uncertainty_us": off.uncertainty_us if off else None,
            "clock_aligned": rank in shifted,
        }
        for rank, off in offsets.items()
    }


def combine_summaries(
    path: Path | str,
    good: list[RankSummary],
    skipped: list[dict],
    *,
    clock_align: str = "auto",
    host: str | None = None,
) -> TracesResult:
    """The traces JSON from every rank's summary: ranks assigned, clocks aligned (`host`: that of
    ranks whose trace names none), collectives matched across ranks. Depends only on the set of
    summaries, not their order, so a merge of shards gives exactly the unsharded result. The
    per-call table rides along as `.calls`."""
    skipped = list(skipped)
    warnings: list[str] = []
    ranks = _assign_ranks(_one_attempt(good, skipped), skipped, warnings)
    skipped.sort(key=lambda s: s["file"])
    if not ranks:
        reasons = "; ".join(f"{Path(s['file']).name}: {s['reason']}" for s in skipped[:3])
        raise InputError(path, f"no usable trace ({reasons})", "fix or re-profile the traces")
    for r in ranks:
        warnings += r.warnings
    clock = _clock_fields(ranks, clock_align, warnings, host)
    worlds = [r.world_size for r in ranks if r.world_size]
    world_size = max(worlds) if worlds else len(ranks)
    warnings += _mixed_job_warnings(path, ranks, worlds)
    warnings += _filter_warnings(ranks)
    lost = [s["file"] for s in skipped if s.get("worker_died")]
    if lost:
        warnings.append(
            f"{path}: partial result — {len(lost)} file(s) lost with the worker analysing them"
            f" ({', '.join(lost[:3])}{', ...' if len(lost) > 3 else ''}); the rest is analysed,"
            " re-run to include them"
        )
    per_rank = {r.rank: r.instances for r in ranks}
    tables = combine_collectives(per_rank, world_size)
    for row in tables["stragglers"]:  # the offset removed before its skew was computed
        row.update(clock[row["rank"]])
    means = [r.step_time_us_mean for r in ranks]
    lo, hi = min(means), max(means)
    result = {
        "schema_version": TRACES_JSON_SCHEMA_VERSION,
        "trace_dir": str(path),
        "world_size": world_size if worlds else None,
        "kind": "gpu" if any(r.kind == "gpu" for r in ranks) else "cpu",
        "clock_align": clock_align,
        # Some file's reduction was lost with its worker (the rest is analysed): see `skipped`.
        "partial": any(s.get("worker_died") for s in skipped),
        "ranks": [{**traces_row(r), **clock[r.rank]} for r in ranks],
        **tables,
        "step_time_spread": {
            "min_us": lo,
            "max_us": hi,
            "spread_pct": 100 * (hi - lo) / lo if lo > 0 else None,
        },
        "skipped": skipped,
        "warnings": warnings,
    }
    out = TracesResult(finite_json(result, warnings))
    out.calls = call_table(per_rank)
    return out
