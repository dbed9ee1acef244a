"""Analyse a folder of per-rank Kineto traces: the "traces JSON" (schema_version 2).

Each file is reduced to its rank summary in its own worker process (events never leave the
worker), then ranks are aligned on one clock and compared: collectives (transfer vs sync, algbw,
busbw), stragglers and step-time spread. A bad file costs one line in `skipped`, never the run.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from tqdm import tqdm

from analysis.errors import unexpected
from analysis.jsonsafe import finite_json
from analysis.trace.collectives import combine_collectives
from analysis.trace.rank import RankSummary, summarize_file
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
    "steps",
    "dropped_events",
    "orphan_kernels",
    "orphan_kernel_us",
    "step_numbers",
    "step_time_us_mean",
    "compute_us",
    "comm_us",
    "exposed_comm_us",
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


def _summarize(path: Path) -> tuple[RankSummary | None, str | None]:
    try:
        return summarize_file(path), None
    except InputError as err:
        return None, f"{err.what} — {err.fix}"
    except Exception as err:  # noqa: BLE001 — RecursionError, MemoryError, ...: one hostile
        # file costs one line, never the other ranks.
        return None, unexpected(err)


def _summaries(files: list[Path], workers: int, progress: bool) -> Iterable[tuple[Path, tuple]]:
    bar = tqdm(
        total=len(files),
        desc="traces",
        unit="file",
        disable=not progress or len(files) < 2,
        leave=False,
    )
    with bar:
        if workers <= 1 or len(files) == 1:
            for f in files:
                yield f, _summarize(f)
                bar.update()
            return
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(_summarize, f): f for f in files}
            for fut in as_completed(futures):
                try:
                    result = fut.result()
                except Exception as err:  # noqa: BLE001 — a worker killed (e.g. out of memory)
                    result = (None, unexpected(err))
                yield futures[fut], result
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


def reduce_files(
    files: list[Path], *, workers: int | None = None, progress: bool = True
) -> tuple[list[RankSummary], list[dict]]:
    """Reduce each file to its rank summary (in worker processes): (summaries, skipped)."""
    workers = max(1, min(workers or os.cpu_count() or 1, len(files) or 1))
    skipped: list[dict] = []
    good: list[RankSummary] = []
    for f, (summary, error) in _summaries(files, workers, progress):
        if error:
            skipped.append({"file": str(f), "reason": error})
        else:
            good.append(summary)
    return good, skipped


def analyze_trace_dir(
    path: Path,
    *,
    workers: int | None = None,
    progress: bool = True,
    exclude: frozenset[Path] = frozenset(),
) -> dict:
    """The traces JSON for every trace file in `path` but those in `exclude` (traces its run's
    record leaves out; see docs/reference/metrics.md for each field).

    Raises InputError when no file could be analysed; otherwise bad files are listed in
    `skipped` with a one-line reason and the rest is analysed.
    """
    files = [f for f in find_trace_files(path) if f not in exclude]
    if not files:
        raise InputError(path, "no trace files of this run", "profile the run again")
    good, skipped = reduce_files(files, workers=workers, progress=progress)
    return combine_summaries(path, good, skipped)


def combine_summaries(path: Path | str, good: list[RankSummary], skipped: list[dict]) -> dict:
    """The traces JSON from every rank's summary: ranks assigned, clocks aligned, collectives
    matched across ranks. Depends only on the set of summaries, not their order, so a merge of
    shards gives exactly the unsharded result."""
    skipped = list(skipped)
    warnings: list[str] = []
    ranks = _assign_ranks(_one_attempt(good, skipped), skipped, warnings)
    skipped.sort(key=lambda s: s["file"])
    if not ranks:
        reasons = "; ".join(f"{Path(s['file']).name}: {s['reason']}" for s in skipped[:3])
        raise InputError(path, f"no usable trace ({reasons})", "fix or re-profile the traces")
    origin = min(r.origin_ns for r in ranks)  # HTA's alignment: earliest event of all ranks = 0
    for r in ranks:
        shift_us = (r.origin_ns - origin) / 1000  # exact integer ns: no float64 absolute clock
        for inst in r.instances.values():
            inst["start_us"] = inst["start_us"] + shift_us
        warnings += r.warnings
    worlds = [r.world_size for r in ranks if r.world_size]
    world_size = max(worlds) if worlds else len(ranks)
    warnings += _mixed_job_warnings(path, ranks, worlds)
    tables = combine_collectives({r.rank: r.instances for r in ranks}, world_size)
    means = [r.step_time_us_mean for r in ranks]
    lo, hi = min(means), max(means)
    result = {
        "schema_version": TRACES_JSON_SCHEMA_VERSION,
        "trace_dir": str(path),
        "world_size": world_size if worlds else None,
        "kind": "gpu" if any(r.kind == "gpu" for r in ranks) else "cpu",
        "ranks": [traces_row(r) for r in ranks],
        **tables,
        "step_time_spread": {
            "min_us": lo,
            "max_us": hi,
            "spread_pct": 100 * (hi - lo) / lo if lo > 0 else None,
        },
        "skipped": skipped,
        "warnings": warnings,
    }
    return finite_json(result, warnings)
