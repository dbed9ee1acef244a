"""dpscope's Python API: the numbers of the CLI and the report, as dicts and pandas DataFrames.

    import analysis as dp
    runs = dp.load_runs("runs")                 # one row per run: the report's run table
    comm = dp.collectives("runs")               # one row per (run, collective)
    traces = dp.analyze_traces("runs/<id>/traces")
    page = dp.build_report("runs", out="reports")
    steps = dp.load_steps("reports")            # Parquet tables of a report (or --parquet) folder

Every function takes run folders or folders of run folders (as `dpscope runs`), is silent unless
`progress=True`, and raises `analysis.InputError` (one line naming the path and the fix) for
bad input. Column names carry their units (`samples_per_s`, `peak_memory_bytes`,
`latency_us_avg`); each number is defined in docs/reference/metrics.md. Heavy modules are
imported when a function runs, so `import analysis` stays cheap (pandas only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd  # at the top so that the DataFrame return types resolve (typing.get_type_hints)

__all__ = [
    "RUN_TABLE_UNITS",
    "analyze_traces",
    "build_report",
    "collectives",
    "compare_runs",
    "load_collectives",
    "load_memory",
    "load_ops",
    "load_runs",
    "load_steps",
]

PathLike = str | Path

# The report's run-table keys that carry no unit of their own get one in the DataFrame (the
# values are unchanged: speedup and efficiency are ratios, efficiency 1.0 = linear scaling).
RUN_TABLE_UNITS = {"speedup": "speedup_ratio", "scaling_efficiency": "scaling_efficiency_ratio"}


def _paths(paths: tuple[PathLike, ...]) -> list[Path]:
    if not paths:
        from profiler.runfolder.errors import InputError

        raise InputError("paths", "none given", "pass run folders or folders of run folders")
    return [Path(p) for p in paths]


def analyze_traces(
    trace_dir: PathLike,
    *,
    workers: int | None = None,
    progress: bool = False,
    executor: str = "process",
    scheduler: str | None = None,
    scheduler_file: PathLike | None = None,
    cache: bool | None = None,
    clock_align: str = "auto",
) -> dict[str, Any]:
    """The traces JSON (`dpscope traces DIR --json`) of one folder of per-rank Kineto traces:
    per-rank compute/communication/overlap, clock offsets, per-collective bandwidth,
    stragglers, warnings and the files skipped with their reason. Fields:
    docs/reference/schemas.md. `clock_align`: off | auto | force (`--clock-align`). `executor="dask"`
    runs the per-rank reductions on a Dask cluster (a LocalCluster without `scheduler` or
    `scheduler_file`); `cache=True` keeps each rank's summary beside its trace
    (None: DPSCOPE_TRACE_CACHE decides)."""
    from analysis.trace.cache import cache_enabled
    from analysis.trace.executors import Executor
    from analysis.trace.folder import analyze_trace_dir

    ex = Executor(
        kind=executor,
        scheduler=scheduler,
        scheduler_file=Path(scheduler_file) if scheduler_file is not None else None,
        cache=cache_enabled(cache),
    )
    return analyze_trace_dir(
        Path(trace_dir), workers=workers, progress=progress, executor=ex, clock_align=clock_align
    )


def load_steps(path: PathLike) -> pd.DataFrame:
    """One row per (run, rank, analysed step) from `steps.parquet` in `path` (a report folder
    or a `dpscope traces --parquet` folder) or that file: step, compute, comm, exposed comm,
    overlap, busy, idle and data-wait time, µs."""
    from analysis.parquet import load_table

    return load_table(Path(path), "steps")


def load_collectives(path: PathLike) -> pd.DataFrame:
    """One row per collective call per rank from `collectives.parquet`: start/end on the job's
    common clock, latency, device, transfer and sync time (µs), bytes, group size."""
    from analysis.parquet import load_table

    return load_table(Path(path), "collectives")


def load_ops(path: PathLike) -> pd.DataFrame:
    """One row per (run, rank, operator) from `ops.parquet`: calls, self and total µs per step,
    % of the step."""
    from analysis.parquet import load_table

    return load_table(Path(path), "ops")


def load_memory(path: PathLike) -> pd.DataFrame:
    """The allocated-bytes timeline per (run, rank, device) from `memory.parquet` (t_us,
    allocated_bytes)."""
    from analysis.parquet import load_table

    return load_table(Path(path), "memory")


def compare_runs(
    *paths: PathLike, traces: bool = True, progress: bool = False, clock_align: str = "auto"
) -> dict[str, Any]:
    """The runs JSON (`dpscope runs ... --json`): every run with its throughput, speedup,
    efficiency, phases, memory and accuracy, groups of seeds, tune folders, and the folders
    skipped or invalid with their reason. `traces=False` skips the trace analysis;
    `clock_align` is analyze_traces'."""
    from analysis.runs.compare import compare_runs as compare

    return compare(_paths(paths), progress=progress, traces=traces, clock_align=clock_align)


def load_runs(*paths: PathLike, traces: bool = True, progress: bool = False) -> pd.DataFrame:
    """One row per run, with the report's run-table columns (summary.csv), units in the names.

    Unreadable and invalid folders are rows too, with their status and reason, as on the page.
    """
    from analysis.columns import SUMMARY_COLS
    from analysis.report.tables import Table, summary_rows, unique_labels
    from analysis.runs.runsjson import read_runs_json

    doc = read_runs_json(compare_runs(*paths, traces=traces, progress=progress))
    rows = summary_rows(doc, unique_labels(doc.runs))
    frame = Table(id="summary", columns=SUMMARY_COLS, rows=rows).frame()
    return frame.rename(columns=RUN_TABLE_UNITS)


def _is_trace_dir(path: Path) -> bool:
    """A folder of trace files itself (not a run folder, nor a folder of run folders)."""
    return not (path / "run.json").exists() and any(path.glob("*.pt.trace.json*"))


def collectives(*paths: PathLike, progress: bool = False) -> pd.DataFrame:
    """One row per (run, collective): calls, bytes, latency, transfer and sync time, algbw and
    busbw, as the report's collectives table. A path may also be a folder of trace files (the
    path as given is then the `run_id`)."""
    from analysis.columns import COLLECTIVE_COLS
    from analysis.report.tables import Table
    from analysis.runs.rows import trace_rows
    from analysis.runs.runsjson import read_runs_json

    rows: list[dict[str, Any]] = []
    runs = [p for p in _paths(paths) if not _is_trace_dir(p)]
    for trace_dir in (p for p in _paths(paths) if _is_trace_dir(p)):
        result = analyze_traces(trace_dir, progress=progress)
        rows += [{"run_id": str(trace_dir), **c} for c in result["collectives"]]
    if runs:
        rows += trace_rows(read_runs_json(compare_runs(*runs, progress=progress)))[0]
    frame = Table(id="collectives", columns=COLLECTIVE_COLS, rows=rows).frame()
    return frame if len(frame) else pd.DataFrame(columns=[c.key for c in COLLECTIVE_COLS])


def build_report(
    *paths: PathLike, out: PathLike = "reports", progress: bool = False, clock_align: str = "auto"
) -> Path:
    """Write the HTML report (index.html, summary.json, the CSV tables) into `out` from the run
    folders in `paths` (trace clocks aligned per `clock_align`); return the path of index.html.
    Raises ReportError (an InputError's sibling: one line) for a missing folder or an output
    that would overwrite an input."""
    from analysis.report.build import build_report as build

    return build(_paths(paths), Path(out), progress=progress, clock_align=clock_align).index_html
