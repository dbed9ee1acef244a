"""dpscope analysis: Kineto traces and run folders in, metrics out. Never imports torch.

The Python API (analysis/api.py; docs/reference/api.md):

- `analyze_traces(dir) -> dict`: the traces JSON of one folder of per-rank traces;
- `compare_runs(*paths) -> dict`: the runs JSON (speedup, efficiency, phases, memory, accuracy);
- `load_runs(*paths) -> DataFrame`: one row per run, the report's run table, units in the names;
- `collectives(*paths) -> DataFrame`: one row per (run, collective);
- `build_report(*paths, out=...) -> Path`: the HTML report; returns index.html.
- `load_steps / load_collectives / load_ops / load_memory(folder) -> DataFrame`: the Parquet
  tables of a report folder or of `dpscope traces DIR --parquet DIR`.

Bad input raises `InputError` (or `ReportError` from build_report), both `UserError`s whose
message is one line naming the path and the fix. Definitions of every number:
docs/reference/metrics.md.
"""

from __future__ import annotations

from typing import Any

from profiler.runfolder.errors import InputError, UserError

_API = (
    "analyze_traces",
    "build_report",
    "collectives",
    "compare_runs",
    "load_collectives",
    "load_memory",
    "load_ops",
    "load_runs",
    "load_steps",
)


def __getattr__(name: str) -> Any:
    # Lazy, for a real reason: `python -m analysis.report` (or any analysis module) imports this
    # package before the entry point's Ctrl-C guard runs (profiler.runfolder.errors.import_main),
    # so the package itself must load nothing heavy (pandas through api, jinja2 through the report).
    if name in _API:
        from analysis import api

        return getattr(api, name)
    if name == "ReportError":
        from analysis.report.build import ReportError

        return ReportError
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")


__all__ = ["InputError", "ReportError", "UserError", *_API]
