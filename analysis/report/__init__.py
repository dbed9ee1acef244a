"""The HTML report: figures, tables and plain-language findings over `compare_runs` output.

This is the only place in dpscope that plots (matplotlib Agg backend via seaborn). It consumes the
runs JSON of `analysis.runs.compare_runs` (schema in docs/analysis.md) and never imports torch.

    python -m analysis.report RUNS [RUNS ...] --out REPORT_DIR
"""

from __future__ import annotations

from analysis.report.build import ReportError, ReportFiles, build_report, write_report

__all__ = ["ReportError", "ReportFiles", "build_report", "write_report"]
