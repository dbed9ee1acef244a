"""The HTML report: figures, tables and plain-language findings over `compare_runs` output.

This is the only place in dpscope that plots (matplotlib Agg backend via seaborn). It consumes the
runs JSON of `analysis.runs.compare.compare_runs` (schema in docs/analysis.md) and never imports torch.

    python -m analysis.report RUNS [RUNS ...] --out REPORT_DIR
"""

from __future__ import annotations

from typing import Any

__all__ = ["ReportError", "ReportFiles", "build_report", "write_report"]


def __getattr__(name: str) -> Any:
    # Lazy: the analysis CLI imports analysis.columns without matplotlib and jinja2.
    if name in __all__:
        from analysis.report import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
