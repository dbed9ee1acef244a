"""The HTML report: figures, tables and plain-language findings over `compare_runs` output.

This is the only place in dpscope that plots (matplotlib Agg backend via seaborn). It consumes the
runs JSON of `analysis.runs.compare.compare_runs` (schema in docs/analysis.md) and never imports torch.

    python -m analysis.report RUNS [RUNS ...] --out REPORT_DIR
"""

from __future__ import annotations

from typing import Any

__all__ = ["ReportError", "ReportFiles", "build_report", "write_report"]


def __getattr__(name: str) -> Any:
    # Lazy, for a real reason: `from analysis.report import build_report` is the public entry, yet
    # importing one submodule (report.tables for its CSV columns) must not load matplotlib and
    # Jinja2 through build.
    if name in __all__:
        from analysis.report import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
